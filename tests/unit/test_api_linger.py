"""A worker that answered a kept-alive connection waits a moment for its next request itself
(server.py's `linger`, pool.py's share of lingering threads): one client's requests back to back
are answered in order by one thread, without the serving thread; a lingering worker never keeps
another connection's request waiting, and a request that comes in pieces, a malformed one or a
client that leaves during the wait are dealt with as the serving thread deals with them."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.support.rawhttp import reply as _reply
from tests.support.waiting import wait_until
from xce_lite.api.limits import Limits
from xce_lite.api.pool import WorkerPool
from xce_lite.api.server import ApiServer


def _request(n: int) -> bytes:
    body = json.dumps({"n": n}).encode()
    return f"POST /xce/v1/echo HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


@pytest.fixture
def server(tmp_path: Path):
    """Start an API server on its own socket whose one route answers {n, the thread's id}."""
    made: list[ApiServer] = []

    def start(workers: int = 2, linger: float = 30.0) -> tuple[ApiServer, Path]:
        def echo(caller, query, body):
            return {"n": body["n"], "thread": threading.get_ident()}

        path = tmp_path / f"api{len(made)}.sock"
        api = ApiServer(path, {("POST", "/echo"): echo}, log=lambda _m: None,
                        limits=Limits(workers=workers, linger=linger))
        threading.Thread(target=api.serve_forever, daemon=True).start()
        made.append(api)
        return api, path

    yield start
    for api in made:
        api.shutdown()
        api.server_close()


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.settimeout(10)  # far below the linger: an answer held behind a lingering worker would time out
    return sock


def test_requests_back_to_back_are_answered_in_order_by_one_thread_that_kept_the_connection(server):
    api, path = server()
    with _connect(path) as sock:
        replies = []
        for n in range(40):
            sock.sendall(_request(n))
            replies.append(_reply(sock))
    assert [r[1]["n"] for r in replies] == list(range(40)) and {r[0] for r in replies} == {200}
    assert len({r[1]["thread"] for r in replies}) == 1
    stats = api.stats()
    assert stats["kept"] == 39 and stats["handed_back"] == 0 and stats["threads"] == 1


def test_a_lingering_worker_keeps_no_other_connection_waiting(server):
    api, path = server(workers=2)
    with _connect(path) as first, _connect(path) as second, _connect(path) as third:
        first.sendall(_request(1))
        assert _reply(first)[0] == 200
        wait_until(lambda: api.stats()["lingering"] == 1, 5, "the first worker to linger")
        second.sendall(_request(2))  # the other thread; it does not linger: half the workers do already
        assert _reply(second)[1]["n"] == 2
        third.sendall(_request(3))
        assert _reply(third)[1]["n"] == 3
        first.sendall(_request(4))  # the lingering worker answers it
        assert _reply(first)[1]["n"] == 4
    assert api.stats()["kept"] == 1


def test_a_request_in_pieces_a_malformed_one_and_a_client_that_leaves_during_the_wait(server):
    api, path = server()
    with _connect(path) as sock:
        sock.sendall(_request(1))
        _reply(sock)
        wait_until(lambda: api.stats()["lingering"] == 1, 5, "the worker to linger")
        raw = _request(2)
        sock.sendall(raw[:10])  # the lingering worker reads a piece: the serving thread awaits the rest
        wait_until(lambda: api.stats()["lingering"] == 0, 5, "the worker to give the connection back")
        time.sleep(0.05)
        sock.sendall(raw[10:])
        status, reply = _reply(sock)
        assert status == 200 and reply["n"] == 2
        wait_until(lambda: api.stats()["lingering"] == 1, 5, "the worker that answered it to linger")
        sock.sendall(b"BREW /coffee HTTP/1.1\r\n\r\n")  # to the lingering worker
        status, reply = _reply(sock)
        assert status == 405 and "GET and POST" in reply["error"]
        assert sock.recv(1) == b""  # and closed
    assert api.stats()["refused"] == 1
    with _connect(path) as sock:
        sock.sendall(_request(3))
        _reply(sock)
        wait_until(lambda: api.stats()["lingering"] == 1, 5, "the worker to linger")
    wait_until(lambda: api.stats()["connections"] == 0, 5, "the closed connection forgotten before the linger ends")


def test_a_worker_lingering_when_the_server_stops_closes_its_connection_itself(server):
    """server_close lists the idle connections once: one a worker armed again after that would
    stay open (and be collected unclosed). A worker that finds the server stopping closes it."""
    api, path = server(linger=30)
    with _connect(path) as sock:
        sock.sendall(_request(1))
        _reply(sock)
        wait_until(lambda: api.stats()["lingering"] == 1, 5, "the worker to linger")
        api.shutdown()  # the serving loop ends; server_close has not run
        sock.sendall(_request(2))
        try:  # closed by the worker: not answered, not watched again (a reset: it left bytes unread)
            ended = sock.recv(1) == b""
        except ConnectionResetError:
            ended = True
        assert ended
    assert api.stats()["connections"] == 0


def test_the_pool_lets_at_most_half_its_threads_linger_and_none_while_work_waits():
    pool = WorkerPool(4, run=lambda _item: None)
    assert pool.linger() and pool.linger()
    assert not pool.linger()  # 2 of 4
    pool.lingered()
    assert pool.linger()
    assert pool.stats()["lingering"] == 2
    assert not WorkerPool(1, run=lambda _item: None).linger()  # one thread never lingers

    release = threading.Event()
    busy = WorkerPool(2, run=lambda _item: release.wait(10))
    for n in range(3):  # two threads taken, one item waits
        busy.submit(n, time.monotonic())
    wait_until(lambda: busy.stats()["queued"] == 1, 5, "an item to wait")
    assert not busy.linger()
    release.set()
    busy.close()
