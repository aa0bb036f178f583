"""The controller's REST JSON API under /xce/v1/ on a Unix socket, with bounded resources.

Who calls is taken from the kernel (SO_PEERCRED on the connection, caller.py), never from the
request: a client cannot claim to be someone else. Handlers are the controller's methods; routing.py
maps routes to them and turns XceError into an HTTP status with `{"error", "kind"}`.

Bounded (observed before: a thread and a store connection per client connection, kept forever;
1,000 idle connections made 1,004 threads). Invariants:
- one thread (`serve_forever`) owns every socket that has no request in progress: it accepts, reads
  requests whole without blocking (http1.py checks them), and closes connections idle for
  `idle_timeout` or that take longer than `request_timeout` to send a request (408). An idle
  keep-alive connection costs a file descriptor, never a thread.
- a connection is watched one-shot (EPOLLONESHOT): the kernel stops watching it when it becomes
  readable, so handing its request to a worker costs no call, and the worker that answered arms
  it again itself (one epoll_ctl), under the lock and only while it is still open and known, so
  that a closed connection's reused descriptor is never armed for it. The serving thread is woken
  for a connection a worker hands back only when bytes of a next request are already buffered.
- a worker that answered waits `linger` seconds at most for the connection's next request itself
  (one poll(2)), while no work is queued and at most half the workers do so: one client's requests
  back to back cost no hand-over between threads. Meanwhile the connection is busy (not watched).
- handlers run on at most `workers` threads (pool.py); a request that finds none free for
  `queue_wait` seconds is answered 503, saying to retry. A long poll (`/jobs/wait`) holds a
  worker: at most `long_polls` of them are held at their full length, the others are answered as
  short polls (1 s), which their clients repeat anyway, so waiters cannot take every worker.
- at most `max_connections` are open: a new one closes the longest-idle one (HTTP lets a server
  close an idle keep-alive connection; our client then reconnects), or, if none is idle, gets 503.
- a body over `max_body` is refused (413) from its Content-Length, before it is read.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from xce_lite.api import cpuslice, http1, sockio
from xce_lite.api.caller import Caller, Callers
from xce_lite.api.limits import LIMITS_ENV, Limits
from xce_lite.api.pool import WorkerPool
from xce_lite.api.routing import LONG_POLLS, Routes, call, short_timeout
from xce_lite.api.sockio import Conn


_ARMED = select.EPOLLIN | select.EPOLLONESHOT  # a connection watched for its next request


class ApiServer:
    def __init__(self, path: Path, routes: Routes, log: Callable[[str], None], mode: int = 0o600,
                 limits: Limits | None = None, group: int | None = None, settle: Callable[[], None] | None = None):
        """`mode` of the socket (0600 personal; 0666 or, with `group`, 0660 shared); `group`: its gid;
        `settle`: called after each handler, before its reply (routing.call)."""
        self.routes, self._settle = routes, settle
        self.log = log
        self.limits = limits or Limits.from_env(os.environ.get(LIMITS_ENV))
        path.unlink(missing_ok=True)  # a stale socket of a dead controller; we hold the home's lock
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound closed (0600), then given its group, then opened: never open to more than `mode` says.
        old = os.umask(0o177)
        try:
            self._listener.bind(str(path))
        finally:
            os.umask(old)
        if group is not None:
            os.chown(path, -1, group)
        if mode != 0o600:
            os.chmod(path, mode)
        self._listener.listen(socket.SOMAXCONN)  # a burst of clients waits here, not refused
        self._listener.setblocking(False)
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._conns: dict[int, Conn] = {}  # fd -> connection (busy ones included)
        self._returned: list[Conn] = []  # handed back by workers, for the serving thread to watch again
        self._mu = threading.Lock()
        self._pool = WorkerPool(self.limits.workers, self._work, start=lambda: cpuslice.short_slice(self.limits.slice))
        self._callers = Callers()
        self._accept_error_logged = -1e9
        self._long_polls = 0  # long polls being held at their full length
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self.counts = {"accepted": 0, "evicted": 0, "busy_503": 0, "timeouts": 0, "refused": 0, "handed_back": 0,
                       "kept": 0}

    # ---- the serving thread ----------------------------------------------------------------------

    def serve_forever(self) -> None:
        cpuslice.short_slice(self.limits.slice)  # a request waits less for a CPU (the workers' too: the pool's start)
        epoll = self._epoll
        listener, wake = self._listener.fileno(), self._wake_r.fileno()
        epoll.register(listener, select.EPOLLIN)
        epoll.register(wake, select.EPOLLIN)
        conns = self._conns
        sweep_at = 0.0
        try:
            while not self._stop.is_set():
                try:
                    for fd, _events in epoll.poll(self._select_timeout()):
                        if fd == listener:
                            self._accept()
                        elif fd == wake:
                            sockio.drain(self._wake_r)
                        else:
                            conn = conns.get(fd)
                            if conn is not None and not conn.busy:  # else a reused descriptor's stale event
                                self._read(conn)
                    self._watch_returned()
                    now = time.monotonic()
                    self._answer_expired(now)
                    if now >= sweep_at:
                        self._sweep(now)
                        sweep_at = now + 0.25
                except Exception as err:  # a bug here must not end the API: say it, serve on
                    self.log(f"API: error in the serving loop: {err!r}")
                    time.sleep(0.1)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving (requests in progress finish on their workers) and wait for the loop to end."""
        self._stop.set()
        sockio.wake(self._wake_w)
        self._stopped.wait(10)

    def server_close(self) -> None:
        for conn, _request in self._pool.close():  # the queued (connection, request) items
            self._close(conn)
        with self._mu:  # workers close their own from now on (_work); these are the serving thread's
            idle = [c for c in self._conns.values() if not c.busy] + self._returned
            self._returned = []
        for conn in idle:
            self._close(conn)
        self._listener.close()
        self._epoll.close()
        self._wake_r.close()  # sockio.wake after this is a no-op (OSError)
        self._wake_w.close()

    def stats(self) -> dict[str, int]:
        """Open connections, long polls held, worker threads (busy, queued work), and how many
        connections were accepted, evicted (longest idle, at the cap), refused (malformed), timed
        out (408) or turned away busy (503), and how many times a worker woke the serving thread
        to take a connection back (`handed_back`: only with a next request already buffered)."""
        with self._mu:
            open_conns, long_polls = len(self._conns), self._long_polls
        return {"connections": open_conns, "long_polls": long_polls, **self._pool.stats(), **self.counts}

    def _select_timeout(self) -> float:
        oldest = self._pool.oldest()
        if oldest is None:
            return 0.25
        return max(0.0, min(0.25, oldest + self.limits.queue_wait - time.monotonic()))

    def _accept(self) -> None:
        for _ in range(64):  # a burst is taken in rounds, so that reads are not starved
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of file descriptors: free one, say so now and then
                now = time.monotonic()
                if now >= self._accept_error_logged + 10:
                    self._accept_error_logged = now
                    self.log(f"API: cannot accept a connection: {err}; closing the longest-idle one")
                victim = self._longest_idle()
                if victim is not None:
                    self.counts["evicted"] += 1
                    self._close(victim)
                else:
                    time.sleep(0.05)  # nothing to free: do not spin on a listener that stays readable
                return
            sock.setblocking(False)
            now = time.monotonic()
            with self._mu:
                full = len(self._conns) >= self.limits.max_connections
            victim = self._longest_idle() if full else None
            if full and victim is None:
                self.counts["busy_503"] += 1
                sockio.send_and_close(sock, http1.error_response(
                    503, f"the controller has {self.limits.max_connections} connections open, all of them with a "
                         f"request in progress; retry in a moment", kind="ControllerDown"))
                continue
            if victim is not None:
                self.counts["evicted"] += 1
                self._close(victim)
            try:
                caller = self._callers.of(sock)
            except OSError:
                sock.close()
                continue
            conn = Conn(sock, caller, now)
            with self._mu:
                self._conns[conn.fd] = conn
            self.counts["accepted"] += 1
            self._epoll.register(conn.fd, _ARMED)

    def _longest_idle(self) -> Conn | None:
        with self._mu:
            return min((c for c in self._conns.values() if not c.busy and not c.buffer),
                       key=lambda c: c.last, default=None)

    def _read(self, conn: Conn) -> None:
        got = self._receive(conn)
        if got is None or (got and not self._take_request(conn, conn.last)):
            self._arm(conn)

    def _receive(self, conn: Conn) -> bool | None:
        """Bytes of `conn` into its buffer: True; None if there were none after all; False if the
        connection ended (it is closed)."""
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return False
        now = time.monotonic()
        conn.last = now
        if conn.started is None:
            conn.started = now
        conn.buffer += data
        return True

    def _take_request(self, conn: Conn, now: float) -> bool:
        """If `conn.buffer` holds a whole request, hand it to a worker; refuse a malformed one.
        False if it needs more bytes: the caller arms it again."""
        request = self._request_in(conn, now)
        if request is None:
            return False
        if request is not False:
            conn.busy = True  # not armed (one-shot): the worker arms it again when it has answered
            self._pool.submit((conn, request), now)
        return True

    def _request_in(self, conn: Conn, now: float) -> http1.Request | Literal[False] | None:
        """The whole request at the start of `conn.buffer`, taken out of it; None if it needs more
        bytes; False if it is malformed (answered with its status, and the connection closed)."""
        try:
            found = http1.parse(conn.buffer, self.limits.max_head, self.limits.max_body)
        except http1.Malformed as err:
            with self._mu:
                self.counts["refused"] += 1
            self._refuse(conn, http1.error_response(err.status, str(err), "SpecError"))
            return False
        if found is None:
            return None
        request, used = found
        del conn.buffer[:used]
        conn.started = now if conn.buffer else None
        return request

    def _arm(self, conn: Conn) -> None:
        """Watch `conn` for its next bytes (again: it is watched one-shot)."""
        try:
            self._epoll.modify(conn.fd, _ARMED)
        except OSError:  # closed meanwhile
            self._close(conn)

    def _watch_returned(self) -> None:
        with self._mu:
            returned, self._returned = self._returned, []
        now = time.monotonic()
        for conn in returned:  # each with bytes of a request sent right behind the last one
            conn.busy = False
            conn.last = now
            if not self._take_request(conn, now):
                self._arm(conn)

    def _answer_expired(self, now: float) -> None:
        for conn, _request in self._pool.expired(now - self.limits.queue_wait):
            self.counts["busy_503"] += 1
            self._refuse(conn, http1.error_response(
                503, f"the controller is busy: all {self.limits.workers} of its API workers have been taken for "
                     f"{self.limits.queue_wait:g} s (long `xce wait`s hold one each); retry in a moment",
                kind="ControllerDown"))

    def _sweep(self, now: float) -> None:
        """Close idle connections; answer 408 to requests that are too slow to arrive."""
        with self._mu:
            idle = [c for c in self._conns.values() if not c.busy]
        for conn in idle:
            if conn.started is not None and now - conn.started > self.limits.request_timeout:
                self.counts["timeouts"] += 1
                self._refuse(conn, http1.error_response(
                    408, f"the request did not arrive whole within {self.limits.request_timeout:g} s"))
            elif conn.started is None and now - conn.last > self.limits.idle_timeout:
                self._close(conn)

    def _refuse(self, conn: Conn, reply: bytes) -> None:
        self._unwatch(conn)
        conn.busy = True  # no longer watched
        sockio.send_and_close(conn.sock, reply)
        self._forget(conn)

    def _close(self, conn: Conn) -> None:
        self._unwatch(conn)
        self._forget(conn)
        conn.sock.close()

    def _unwatch(self, conn: Conn) -> None:
        """No event of `conn` any more (closing it would do that too, but only once no other
        descriptor refers to its socket)."""
        try:
            self._epoll.unregister(conn.fd)
        except (OSError, ValueError):  # not registered, or the epoll is closed at shutdown
            pass

    def _forget(self, conn: Conn) -> None:
        with self._mu:
            if self._conns.get(conn.fd) is conn:
                del self._conns[conn.fd]

    # ---- the workers --------------------------------------------------------------------------------

    def _work(self, item: tuple[Conn, http1.Request]) -> None:
        conn, request = item
        while True:
            status, payload = self._answer(conn.caller, request)
            close = not request.keep_alive or self._stop.is_set()
            try:
                sockio.send(conn.sock, http1.response(status, payload, close), self.limits.send_timeout)
            except OSError:
                close = True
            if close:
                self._forget(conn)
                conn.sock.close()
                return
            if conn.buffer:  # bytes of a next request came with this one: the serving thread parses them
                with self._mu:
                    stopping = self._stop.is_set()  # the serving thread takes nothing back any more
                    if not stopping:
                        self._returned.append(conn)
                        self.counts["handed_back"] += 1
                if not stopping:
                    sockio.wake(self._wake_w)
                    return
                break
            following = self._linger(conn)
            if following is False:  # closed, or refused
                return
            if following is None:
                break
            request = following
        with self._mu:
            # Stopping: closed below, by this thread, since server_close may have listed the idle
            # connections already; else it is its to close (it takes the list under this lock).
            if self._conns.get(conn.fd) is conn and not self._stop.is_set():
                conn.busy = False
                conn.last = time.monotonic()
                try:  # under the lock: closers forget it under the lock before they close it
                    self._epoll.modify(conn.fd, _ARMED)
                    return
                except (OSError, ValueError):
                    conn.busy = True  # not watched: closed below by its owner, this thread
        self._forget(conn)
        conn.sock.close()  # a socket object closes once (its descriptor is -1 after), never another's

    def _linger(self, conn: Conn) -> http1.Request | Literal[False] | None:
        """The next request on `conn`, which this worker has just answered, if it arrives whole
        within `limits.linger` while workers are to spare (pool.py): a client that sends request
        after request (one POST per job) is served by one thread, without a wake-up of the serving
        thread, a hand-over to a worker and an epoll_ctl per request. None: it did not (come, or
        come whole), the serving thread watches it again; False: it ended, or was refused."""
        if not self._pool.linger():
            return None
        try:
            came = sockio.readable(conn.sock, self.limits.linger)
        finally:
            self._pool.lingered()
        if not came or self._stop.is_set():
            return None
        got = self._receive(conn)
        if got is not True:
            return got  # None: nothing after all; False: it ended
        request = self._request_in(conn, conn.last)
        if isinstance(request, http1.Request):
            with self._mu:
                self.counts["kept"] += 1
        return request

    def _answer(self, caller: Caller, request: http1.Request) -> tuple[int, bytes]:
        if request.path in LONG_POLLS:
            with self._mu:
                held = self._long_polls < self.limits.long_polls
                self._long_polls += held
            try:
                query = request.query if held else {**request.query,
                                                    "timeout": short_timeout(request.query.get("timeout"))}
                return call(self.routes, caller, request, query, self.log, self._settle)
            finally:
                with self._mu:
                    self._long_polls -= held
        return call(self.routes, caller, request, request.query, self.log, self._settle)

