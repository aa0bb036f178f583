"""The API server is bounded, provoked for real on a real controller: reads leave no file
descriptor behind, idle connections cost no thread and are closed, a slow or oversized or malformed
request is refused with its status, and a server whose workers are all taken says so (503) and
recovers. After each fault the controller still answers, and its log has no internal error."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading

import pytest

from tests.support.cluster import Cluster
from tests.support.rawhttp import reply as _reply
from tests.support.waiting import wait_until
from xce_lite import errors
from xce_lite.api.client import Client


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _connect(c: Cluster, timeout: float = 10) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(c.home / "xce.sock"))  # blocking: waits while the listen backlog is full
    sock.settimeout(timeout)
    return sock


def _raw(c: Cluster, data: bytes) -> tuple[int, dict]:
    with _connect(c) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # refused before the whole body was sent (413): the reply is there all the same
        return _reply(sock)


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def _no_internal_error(c: Cluster) -> None:
    log = (c.home / "controller.log").read_text()
    assert "internal error" not in log and "Traceback" not in log and "error in the serving loop" not in log, log


def _start(c: Cluster, limits: str = "") -> int:
    if limits:
        c.env["XCE_API_LIMITS"] = limits
    c.start()
    pid = c.controller_pid
    assert pid is not None
    return pid


def test_300_reads_leave_no_file_descriptor_or_thread_behind(idle_cluster: Cluster):
    """Observed before: every connection left its thread's store connection open (300 `xce jobs`:
    12 -> 612 fds). Each read here is a connection of its own, as each `xce jobs` is."""
    c = idle_cluster
    pid = _start(c, "workers=2")
    c.submit("true")

    def read_on_new_connections(n: int) -> None:
        for _ in range(n):
            api = Client(c.home / "xce.sock")
            assert api.get("/jobs", all=1, user="all")["jobs"]
            api.close()

    warm = [threading.Thread(target=read_on_new_connections, args=(20,)) for _ in range(3)]
    for t in warm:  # both workers exist and have read, so both hold their store connection
        t.start()
    for t in warm:
        t.join()
    before_fds, before_threads = _fds(pid), _threads(pid)
    read_on_new_connections(300)
    wait_until(lambda: _fds(pid) <= before_fds, 10, f"the controller's fds back to {before_fds} (now {_fds(pid)})")
    assert _threads(pid) <= before_threads
    assert c.xce("jobs", "-a").returncode == 0
    _no_internal_error(c)


def test_1000_idle_connections_make_no_threads_and_the_server_still_answers(cluster: Cluster):
    """Observed before: 1,000 idle connections = 1,004 threads, no cap."""
    pid = cluster.controller_pid
    cluster.xce("wait", str(cluster.submit("true")))  # the scheduler's pool and a worker's reader exist
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    before_threads, before_fds = _threads(pid), _fds(pid)
    idle = []
    try:
        for _ in range(1000):
            idle.append(_connect(cluster))
        answered = cluster.xce("jobs", "-a")
        assert answered.returncode == 0, answered.stderr
        assert _threads(pid) <= before_threads + 2  # a worker or two more at most, never one per connection
        assert _fds(pid) <= before_fds + 512 + 8  # the connection cap (the longest-idle ones were closed)
        # the ones the cap closed see the end of their connection, as an idle keep-alive does
        wait_until(lambda: sum(_closed_by_server(s) for s in idle[:50]) > 0, 10, "the oldest idle ones closed")
    finally:
        for sock in idle:
            sock.close()
    assert cluster.submit("true") > 0
    wait_until(lambda: _fds(pid) <= before_fds + 4, 10, f"the controller's fds back near {before_fds}")
    _no_internal_error(cluster)


def test_idle_connection_is_closed_and_a_kept_alive_client_reconnects(idle_cluster: Cluster):
    c = idle_cluster
    _start(c, "idle_timeout=1")
    api = Client(c.home / "xce.sock")
    assert api.get("/status")["jobs"]["active"] == 0  # its connection stays open (keep-alive)
    idle = _connect(c, timeout=0.2)
    wait_until(lambda: _closed_by_server(idle), 15, "the server to close the idle connection")
    idle.close()
    # the client's kept-alive connection was closed the same way: it notices and asks again, once
    assert api.get("/status")["jobs"]["active"] == 0
    api.close()
    _no_internal_error(c)


def test_a_request_that_arrives_too_slowly_gets_408_and_others_are_served(idle_cluster: Cluster):
    c = idle_cluster
    _start(c, "request_timeout=1")
    with _connect(c) as slow:
        slow.sendall(b"POST /xce/v1/jobs HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"jobs\"")
        assert c.xce("jobs").returncode == 0  # served meanwhile
        status, reply = _reply(slow)
    assert status == 408 and "did not arrive whole within 1 s" in reply["error"]
    _no_internal_error(c)


def test_a_body_over_the_limit_is_refused_413_before_it_is_read(cluster: Cluster):
    huge = 17 << 20
    status, reply = _raw(cluster, f"POST /xce/v1/jobs HTTP/1.1\r\nContent-Length: {huge}\r\n\r\n".encode())
    assert status == 413 and "more than the 16777216" in reply["error"] and "fewer jobs" in reply["error"]
    api = Client(cluster.home / "xce.sock")
    spec = {"argv": ["true"], "cwd": str(cluster.work), "env": {"BIG": "x" * huge}}
    with pytest.raises(errors.SpecError) as caught:  # the client reads the refusal though its send was cut
        api.post("/jobs", {"jobs": [spec]})
    assert "more than the 16777216" in str(caught.value)
    api.close()
    assert json.loads(cluster.ok("jobs", "-a", "--json"))["jobs"] == []
    _no_internal_error(cluster)


def _post(body: bytes, length: str | None = None, path: str = "/xce/v1/jobs") -> bytes:
    return f"POST {path} HTTP/1.1\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n".encode() + body


MALFORMED = [
    (_post(b"", "-5"), 400, "Content-Length must be a whole number"),
    (_post(b"", "abc"), 400, "Content-Length must be a whole number"),
    (_post(b"[" * 100_000 + b"]" * 100_000), 400, "nests deeper than 64"),
    (_post(b'{"jobs": [{"argv": ["\xff"]}]}'), 400, "not UTF-8"),
    (_post(b'{"jobs": [{"argv": ["true"], "run_limit": NaN}]}'), 400, "not a JSON number"),
    (_post(b"[]"), 400, "must be a JSON object"),
    (_post(b'{"jobs": {}}'), 400, "at least one job spec"),
    (_post(b'{"jobs": [{"argv": "true", "cwd": "/"}]}'), 400, "the command is empty"),
    (_post(b'{"jobs": [{"argv": ["true"], "cwd": "/", "slots": "2"}]}'), 400, "slots"),
    (_post(b'{"jobs": [{"argv": ["true"], "cwd": "/"}], "request_id": 5}'), 400, "request_id"),
    (_post(b'{"ids": {}}', path="/xce/v1/jobs/kill"), 400, "naming at least one job"),
    (_post(b'{"ids": ["99999999999999999999999"]}', path="/xce/v1/jobs/kill"), 404, "no such job"),
    (_post(b'{"ids": [1, 424242, "x"]}', path="/xce/v1/jobs/kill"), 404, "no such job: 424242"),  # the first wrong
    (_post(b'{"ids": [1, "x", 424242]}', path="/xce/v1/jobs/kill"), 400, "'x' is not a job"),
    (_post(b'{"names": 5}', path="/xce/v1/hosts/reconnect"), 400, "names"),
    (b"GET /xce/v1/jobs/wait?ids=1&timeout=abc HTTP/1.1\r\n\r\n", 400, "timeout must be a number"),
    (b"GET /xce/v1/jobs?ids=%ff HTTP/1.1\r\n\r\n", 400, "not percent-encoded UTF-8"),
    (b"GET /xce/v1/jobs?ids=\xff HTTP/1.1\r\n\r\n", 400, "must be ASCII"),
    (b"hello\r\n\r\n", 400, "not an HTTP/1.x request line"),
    (b"PUT /xce/v1/jobs HTTP/1.1\r\n\r\n", 405, "GET and POST"),
    (b"POST /xce/v1/jobs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "Content-Length"),
]


def test_malformed_requests_of_every_kind_get_their_status_and_the_server_serves_on(cluster: Cluster):
    """Observed before: a negative or non-numeric Content-Length and JSON nested 100,000 deep gave
    500 'internal error'. One controller for every kind, in sequence: none may upset the next."""
    cluster.submit("true")
    problems = []
    for raw, status, words in MALFORMED:
        got, reply = _raw(cluster, raw)
        if got != status or words not in reply.get("error", ""):
            problems.append(f"{raw[:60]!r}: {got} {reply}")
        if cluster.xce("jobs", "-a").returncode != 0:
            problems.append(f"{raw[:60]!r}: the server stopped answering")
    assert not problems, "\n".join(problems)
    _no_internal_error(cluster)


def test_all_workers_taken_is_a_clear_503_and_the_server_recovers(idle_cluster: Cluster):
    """Two long polls hold both workers: a third request waits `queue_wait`, then is told the
    controller is busy (the CLI asks again a few times, then exits 3 saying what to do); once the
    polls end, requests are served again."""
    c = idle_cluster
    _start(c, "workers=2,queue_wait=1,long_polls=2")
    job = c.submit("sleep", "300")
    c.wait_state(job, {"RUN"})
    polls = [_connect(c, timeout=90) for _ in range(2)]
    for sock in polls:  # longer than the CLI's own retries below
        sock.sendall(f"GET /xce/v1/jobs/wait?ids={job}&timeout=25 HTTP/1.1\r\n\r\n".encode())
    status, reply = _raw(c, b"GET /xce/v1/status HTTP/1.1\r\n\r\n")
    assert status == 503 and "busy" in reply["error"] and "retry" in reply["error"]
    busy = c.xce("jobs")
    assert busy.returncode == 3 and "busy" in busy.stderr and "Traceback" not in busy.stderr
    for sock in polls:  # they end on their own
        status, reply = _reply(sock)
        assert status == 200 and reply["finished"] is False
        sock.close()
    assert c.xce("jobs").returncode == 0
    assert c.xce("kill", str(job)).returncode == 0
    _no_internal_error(c)


def test_long_polls_beyond_their_share_are_answered_as_short_polls(idle_cluster: Cluster):
    """Waiters cannot take every worker: with one long poll held, a second one is answered after
    about a second (not finished), `xce jobs` is served meanwhile, and `xce wait` still ends when
    the job does."""
    c = idle_cluster
    _start(c, "workers=2,long_polls=1,queue_wait=30")
    job = c.submit("sleep", "300")
    c.wait_state(job, {"RUN"})
    held = _connect(c, timeout=90)
    held.sendall(f"GET /xce/v1/jobs/wait?ids={job}&timeout=25 HTTP/1.1\r\n\r\n".encode())
    api = Client(c.home / "xce.sock")
    wait_until(lambda: api.get("/status")["api"]["long_polls"] == 1, 10, "the first poll to be held")
    api.close()
    for _ in range(3):  # each answered without holding the second worker
        status, reply = _raw(c, f"GET /xce/v1/jobs/wait?ids={job}&timeout=25 HTTP/1.1\r\n\r\n".encode())
        assert status == 200 and reply["finished"] is False
        assert c.xce("jobs").returncode == 0
    waiter = c.xce("wait", str(job), "--timeout", "3")
    assert waiter.returncode == 124  # still running: its polls were short, and it kept polling
    assert c.xce("kill", str(job)).returncode == 0
    assert c.xce("wait", str(job)).returncode == 1  # ended EXIT (killed), seen through short polls
    status, reply = _reply(held)
    held.close()
    assert status == 200 and reply["jobs"][0]["state"] == "EXIT"
    _no_internal_error(c)


def test_requests_on_a_kept_alive_connection_are_answered_in_order_without_waking_the_serving_thread(
        idle_cluster: Cluster):
    """Issue 18: a worker that answered arms its connection again itself (one-shot epoll), so a
    request that came alone costs the serving thread no wake-up; requests sent back to back (two
    in one send, one in pieces) are still each answered once, in order, on the same connection."""
    c = idle_cluster
    _start(c, "workers=2")
    api = Client(c.home / "xce.sock")
    before = api.get("/status")["api"]["handed_back"]
    ids = [api.submit({"jobs": [{"argv": ["true"], "cwd": str(c.home), "hold": True}]})["ids"][0] for _ in range(30)]
    assert len(set(ids)) == 30
    for _ in range(20):
        api.get("/status")
    assert api.get("/status")["api"]["handed_back"] == before  # 51 requests, none handed back
    api.close()

    def get(path: str) -> bytes:
        return f"GET /xce/v1{path} HTTP/1.1\r\nHost: xce\r\n\r\n".encode()

    with _connect(c) as sock:
        sock.sendall(get(f"/jobs?ids={ids[0]}") + get(f"/jobs?ids={ids[1]}"))  # two in one send
        first, second = _replies(sock, 2)
        assert first[0] == second[0] == 200
        assert [j["id"] for j in first[1]["jobs"]] == [ids[0]] and [j["id"] for j in second[1]["jobs"]] == [ids[1]]
        request = get(f"/jobs?ids={ids[2]}")
        sock.sendall(request[:10])  # one in pieces (if they arrive apart, the connection is armed again)
        sock.sendall(request[10:])
        [(status, reply)] = _replies(sock, 1)
        assert status == 200 and [j["id"] for j in reply["jobs"]] == [ids[2]]
    _no_internal_error(c)


def _replies(sock: socket.socket, n: int) -> list[tuple[int, dict]]:
    """Read `n` responses that may arrive in one chunk: (status, JSON body) each, in order."""
    data, out = b"", []
    while len(out) < n:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            lines = data[:end].decode().split("\r\n")
            length = next(int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                          if k.lower() == "content-length")
            if len(data) >= end + 4 + length:
                out.append((int(lines[0].split()[1]), json.loads(data[end + 4:end + 4 + length])))
                data = data[end + 4 + length:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {len(out)} of {n} replies"
        data += chunk
    return out
