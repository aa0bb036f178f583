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

from xce_lite.api import http1
from xce_lite.api.caller import Caller, Callers
from xce_lite.api.limits import LIMITS_ENV, Limits
from xce_lite.api.pool import WorkerPool
from xce_lite.api.routing import LONG_POLLS, Routes, call, short_timeout


_ARMED = select.EPOLLIN | select.EPOLLONESHOT  # a connection watched for its next request


class _Conn:
    """One client connection. While `busy` a worker owns it; otherwise the serving thread does."""

    __slots__ = ("buffer", "busy", "caller", "fd", "last", "sock", "started")

    def __init__(self, sock: socket.socket, caller: Caller, now: float):
        self.sock = sock
        self.fd = sock.fileno()  # the key in ApiServer._conns (a closed socket forgets its fd)
        self.caller = caller
        self.buffer = bytearray()
        self.last = now  # when it last sent bytes or got a reply
        self.started: float | None = None  # when the request being received began
        self.busy = False


class ApiServer:
    def __init__(self, path: Path, routes: Routes, log: Callable[[str], None], mode: int = 0o600,
                 limits: Limits | None = None, group: int | None = None):
        """`mode` of the socket (0600 personal; 0666 or, with `group`, 0660 shared); `group`: its gid."""
        self.routes = routes
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
        self._conns: dict[int, _Conn] = {}  # fd -> connection (busy ones included)
        self._returned: list[_Conn] = []  # handed back by workers, for the serving thread to watch again
        self._mu = threading.Lock()
        self._pool = WorkerPool(self.limits.workers, self._work)
        self._callers = Callers()
        self._accept_error_logged = -1e9
        self._long_polls = 0  # long polls being held at their full length
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self.counts = {"accepted": 0, "evicted": 0, "busy_503": 0, "timeouts": 0, "refused": 0, "handed_back": 0}

    # ---- the serving thread ----------------------------------------------------------------------

    def serve_forever(self) -> None:
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
                            _drain(self._wake_r)
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
        self._wakeup()
        self._stopped.wait(10)

    def server_close(self) -> None:
        for conn, _request in self._pool.close():  # the queued (connection, request) items
            self._close(conn)
        with self._mu:
            idle = [c for c in self._conns.values() if not c.busy]
        for conn in idle:
            self._close(conn)
        self._listener.close()
        self._epoll.close()
        self._wake_r.close()  # _wakeup after this is a no-op (OSError)
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
                _send_and_close(sock, http1.error_response(
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
            conn = _Conn(sock, caller, now)
            with self._mu:
                self._conns[conn.fd] = conn
            self.counts["accepted"] += 1
            self._epoll.register(conn.fd, _ARMED)

    def _longest_idle(self) -> _Conn | None:
        with self._mu:
            return min((c for c in self._conns.values() if not c.busy and not c.buffer),
                       key=lambda c: c.last, default=None)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            self._arm(conn)
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        now = time.monotonic()
        conn.last = now
        if conn.started is None:
            conn.started = now
        conn.buffer += data
        if not self._take_request(conn, now):
            self._arm(conn)

    def _take_request(self, conn: _Conn, now: float) -> bool:
        """If `conn.buffer` holds a whole request, hand it to a worker; refuse a malformed one.
        False if it needs more bytes: the caller arms it again."""
        try:
            found = http1.parse(conn.buffer, self.limits.max_head, self.limits.max_body)
        except http1.Malformed as err:
            self.counts["refused"] += 1
            self._refuse(conn, http1.error_response(err.status, str(err), "SpecError"))
            return True
        if found is None:
            return False
        request, used = found
        del conn.buffer[:used]
        conn.started = now if conn.buffer else None
        conn.busy = True  # not armed (one-shot): the worker arms it again when it has answered
        self._pool.submit((conn, request), now)
        return True

    def _arm(self, conn: _Conn) -> None:
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

    def _refuse(self, conn: _Conn, reply: bytes) -> None:
        self._unwatch(conn)
        conn.busy = True  # no longer watched
        _send_and_close(conn.sock, reply)
        self._forget(conn)

    def _close(self, conn: _Conn) -> None:
        self._unwatch(conn)
        self._forget(conn)
        conn.sock.close()

    def _unwatch(self, conn: _Conn) -> None:
        """No event of `conn` any more (closing it would do that too, but only once no other
        descriptor refers to its socket)."""
        try:
            self._epoll.unregister(conn.fd)
        except (OSError, ValueError):  # not registered, or the epoll is closed at shutdown
            pass

    def _forget(self, conn: _Conn) -> None:
        with self._mu:
            if self._conns.get(conn.fd) is conn:
                del self._conns[conn.fd]

    def _wakeup(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # already full of wake-ups, or closed at shutdown

    # ---- the workers --------------------------------------------------------------------------------

    def _work(self, item: tuple[_Conn, http1.Request]) -> None:
        conn, request = item
        status, payload = self._answer(conn.caller, request)
        close = not request.keep_alive or self._stop.is_set()
        try:
            _send(conn.sock, http1.response(status, payload, close), self.limits.send_timeout)
        except OSError:
            close = True
        if close:
            self._forget(conn)
            conn.sock.close()
            return
        if conn.buffer:  # bytes of a next request came with this one: the serving thread parses them
            with self._mu:
                self._returned.append(conn)
                self.counts["handed_back"] += 1
            self._wakeup()
            return
        with self._mu:
            if self._conns.get(conn.fd) is conn:  # else forgotten meanwhile: closed below
                conn.busy = False
                conn.last = time.monotonic()
                try:  # under the lock: closers forget it under the lock before they close it
                    self._epoll.modify(conn.fd, _ARMED)
                    return
                except (OSError, ValueError):
                    conn.busy = True  # not watched: closed below by its owner, this thread
        self._forget(conn)
        conn.sock.close()  # a socket object closes once (its descriptor is -1 after), never another's

    def _answer(self, caller: Caller, request: http1.Request) -> tuple[int, bytes]:
        if request.path in LONG_POLLS:
            with self._mu:
                held = self._long_polls < self.limits.long_polls
                self._long_polls += held
            try:
                query = request.query if held else {**request.query,
                                                    "timeout": short_timeout(request.query.get("timeout"))}
                return call(self.routes, caller, request, query, self.log)
            finally:
                with self._mu:
                    self._long_polls -= held
        return call(self.routes, caller, request, request.query, self.log)


def _send(sock: socket.socket, data: bytes, timeout: float) -> None:
    """All of `data` on the non-blocking `sock`: at once if the socket's buffer takes it (a reply
    mostly fits), else waiting at most `timeout` for it to drain (OSError if it does not)."""
    try:
        sent = sock.send(data)
    except (BlockingIOError, InterruptedError):
        sent = 0
    if sent == len(data):
        return
    sock.settimeout(timeout)
    try:
        sock.sendall(memoryview(data)[sent:])
    finally:
        sock.setblocking(False)


def _send_and_close(sock: socket.socket, reply: bytes) -> None:
    """Best effort, without blocking: a small reply fits in the socket's buffer."""
    try:
        sock.send(reply)
    except OSError:
        pass
    sock.close()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass
