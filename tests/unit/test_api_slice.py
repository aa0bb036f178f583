"""The API's threads run with a short CPU slice (api/cpuslice.py), and nothing they start keeps it:
the serving thread and every worker ask for Limits.slice (the kernel's least, 0.1 ms, unless
XCE_API_LIMITS says otherwise), a thread or a process a handler starts has the kernel's default,
and slice=0 leaves the API's threads at the default too."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.rawhttp import reply as _reply
from xce_lite import errors
from xce_lite.api import cpuslice
from xce_lite.api.limits import Limits
from xce_lite.api.server import ApiServer

DEFAULT = cpuslice.slice_of()  # the test's main thread: the kernel's default slice


def _slices(caller, query, body) -> dict:
    """This worker's slice, a thread's it starts, a process's it starts (read from /proc)."""
    started: list[int | None] = []
    thread = threading.Thread(target=lambda: started.append(cpuslice.slice_of()))
    thread.start()
    thread.join()
    child = subprocess.Popen(["sleep", "30"])
    try:
        lines = Path(f"/proc/{child.pid}/sched").read_text().splitlines()
        process = next(int(line.split(":")[1]) for line in lines if line.startswith("se.slice"))
    finally:
        child.kill()
        child.wait()
    return {"worker": cpuslice.slice_of(), "thread": started[0], "process": process}


def _serve(path: Path, limits: Limits) -> ApiServer:
    """A server whose one route answers the slices."""
    api = ApiServer(path, {("GET", "/slices"): _slices}, log=lambda _m: None, limits=limits)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    return api


def _get(path: Path) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(b"GET /xce/v1/slices HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        status, body = _reply(sock)
    assert status == 200, body
    return body


@pytest.mark.parametrize("limit, expected", [(None, 100_000), (0.0, DEFAULT), (0.002, 2_000_000)])
def test_api_workers_run_with_the_short_slice_and_what_they_start_does_not(tmp_path, limit, expected):
    assert DEFAULT is not None and DEFAULT != 100_000, "the kernel reports no slice, or a short one by default"
    limits = Limits(workers=2) if limit is None else Limits(workers=2, slice=limit)
    api = _serve(tmp_path / "api.sock", limits)
    try:
        got = _get(tmp_path / "api.sock")
    finally:
        api.shutdown()
        api.server_close()
    assert got == {"worker": expected, "thread": DEFAULT, "process": DEFAULT}


def test_the_serving_thread_asks_for_the_short_slice_too(tmp_path):
    api = ApiServer(tmp_path / "api.sock", {}, log=lambda _m: None, limits=Limits(workers=1))
    seen: list[int | None] = []

    def serve() -> None:
        api.serve_forever()
        seen.append(cpuslice.slice_of())  # still the serving thread, after it stopped serving

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    api.shutdown()
    thread.join(10)
    api.server_close()
    assert seen == [100_000]


def test_the_slice_limit_may_be_zero_but_not_below():
    assert Limits.from_env("slice=0").slice == 0.0 and Limits.from_env(None).slice == cpuslice.SLICE
    with pytest.raises(errors.ConfigError, match="slice must be above 0 \\(or 0\\)"):
        Limits.from_env("slice=-1")
    with pytest.raises(errors.ConfigError, match="linger must be above 0$"):
        Limits.from_env("linger=0")


def test_short_slice_keeps_the_nice_value_asks_nothing_for_zero_and_says_what_the_kernel_clamped():
    result: list = []

    def run() -> None:
        import os

        os.setpriority(os.PRIO_PROCESS, 0, 3)  # this thread only (Linux: a thread's own nice value)
        result.append((cpuslice.short_slice(0), cpuslice.slice_of(), cpuslice.short_slice(), cpuslice.slice_of(),
                       os.getpriority(os.PRIO_PROCESS, 0), cpuslice.short_slice(1.0), cpuslice.slice_of()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert result == [(False, DEFAULT, True, 100_000, 3, True, 100_000_000)]  # the kernel's bound: 100 ms
