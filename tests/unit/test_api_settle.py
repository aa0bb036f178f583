"""The API server calls its `settle` after each handler and before the reply (routing.call): the
controller passes the store's settle_reads, so that no reply tells what a power loss could undo (a
commit is readable before its fdatasync, store/walsync.py). A settle that fails answers its error."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from tests.support.rawhttp import reply
from tests.support.store import T, spec
from xce_lite.api.server import ApiServer
from xce_lite.errors import StoreError
from xce_lite.store import walsync
from xce_lite.store.jobs import JobStore


def _ask(path: Path, timeout: float = 10) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.settimeout(timeout)
    body = json.dumps({}).encode()
    sock.sendall(f"POST /xce/v1/look HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


@pytest.fixture
def serve(tmp_path: Path):
    made: list[ApiServer] = []

    def start(handler, settle) -> Path:
        path = tmp_path / f"api{len(made)}.sock"
        api = ApiServer(path, {("POST", "/look"): handler}, log=lambda _m: None, settle=settle)
        threading.Thread(target=api.serve_forever, daemon=True).start()
        made.append(api)
        return path

    yield start
    for api in made:
        api.shutdown()
        api.server_close()


def test_the_reply_waits_for_settle_after_the_handler(serve) -> None:
    order: list[str] = []
    settled = threading.Event()

    def settle() -> None:
        order.append("settle")
        assert settled.wait(10)

    path = serve(lambda caller, query, body: order.append("handler") or {"ok": True}, settle)
    with _ask(path) as sock:
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # no reply while settle waits
        settled.set()
        sock.settimeout(10)
        assert reply(sock) == (200, {"ok": True})
    assert order == ["handler", "settle"]


def test_a_settle_that_fails_answers_its_error(serve) -> None:
    def settle() -> None:
        raise StoreError("the job store's WAL could not be synced")

    path = serve(lambda caller, query, body: {"ok": True}, settle)
    with _ask(path) as sock:
        status, body = reply(sock)
    assert status == 500 and body["kind"] == "StoreError" and "could not be synced" in body["error"]


def test_a_reply_that_read_a_commit_not_yet_on_disk_waits_for_its_fdatasync(serve, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With the store's settle_reads (as the controller wires it): a handler that read another
    writer's commit is answered only after an fdatasync begun after that read."""
    store = JobStore(tmp_path / "xce.db")
    synced: list[int] = []
    real = walsync.os.fdatasync
    monkeypatch.setattr(walsync.os, "fdatasync", lambda fd: synced.append(threading.get_ident()) or real(fd))
    try:
        store.submit([(spec("true"), "normal")], "alice", T)
        handler_thread: list[int] = []

        def look(caller, query, body):
            handler_thread.append(threading.get_ident())
            store._sync.committed += 1  # as if another writer had just committed, its sync not yet done
            return {"jobs": len(store.jobs(user="alice"))}

        path = serve(look, store.settle_reads)
        with _ask(path) as sock:
            assert reply(sock) == (200, {"jobs": 1})
        assert synced[-1] == handler_thread[0] and store._sync.synced == store._sync.committed
    finally:
        store.close()
