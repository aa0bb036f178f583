"""Running the controller as a daemon: the home's lock, detaching, and waiting for it to answer.

One controller per home: it holds an exclusive flock on `controller.lock` for its whole life, and
writes its pid there so a second start can say who holds it. The lock dies with the process (even
on kill -9), so a stale lock file never blocks a restart. A controller that stops on a fault
(controller/faults.py) leaves why in `controller.fault`, shown by `xce controller status` until a
clean stop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

from xce_lite.api.client import Client
from xce_lite.errors import ControllerDown, HomeError, XceError
from xce_lite.home.paths import Home


class AlreadyRunning(XceError):
    """Another controller holds this home's lock."""


@contextlib.contextmanager
def hold_lock(home: Home) -> Iterator[None]:
    fd = os.open(home.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise AlreadyRunning(
                f"a controller is already running for {home.root} (pid {holder}, holding {home.lock}); "
                f"stop it with `xce controller stop`") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def lock_holder(home: Home) -> int | None:
    """The pid of the controller holding the lock, or None if nobody holds it."""
    try:
        fd = os.open(home.lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def open_log(home: Home):
    """The controller's log, for appending: 0600 (made so, or closed to others if an older version
    left it open): it may quote jobs' commands and hosts' errors."""
    fd = os.open(home.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if os.fstat(fd).st_mode & 0o077:
        os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def start_detached(home: Home, timeout: float = 30.0) -> int:
    """Start `xce controller start --foreground` in its own session; its pid once it answers."""
    holder = lock_holder(home)
    if holder is not None:
        raise AlreadyRunning(f"a controller is already running for {home.root} (pid {holder}); "
                             f"stop it with `xce controller stop`")
    log = open_log(home)
    start = log.seek(0, os.SEEK_END)  # what this start writes begins here: earlier starts' errors are not its own
    try:
        # `-m xce_lite` drops the caller's directory from sys.path (__main__.py): a yaml.py there is not imported
        child = subprocess.Popen(
            [sys.executable, "-m", "xce_lite", "--home", str(home.root), "controller", "start", "--foreground"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
    finally:
        log.close()
    deadline = time.monotonic() + timeout
    client = Client(home.socket, timeout=5)
    try:
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise HomeError(f"the controller exited at start (code {child.returncode}):\n{tail(home, since=start)}")
            try:
                client.get("/status")
                return child.pid
            except ControllerDown:
                time.sleep(0.05)
    finally:
        client.close()
    raise ControllerDown(f"the controller did not answer within {timeout:.0f} s; its log:\n{tail(home, since=start)}")


def stop(home: Home, timeout: float = 30.0) -> int | None:
    """Ask the controller to stop and wait until its lock is free; its pid, or None if none ran."""
    holder = lock_holder(home)
    if holder is None:
        return None
    client = Client(home.socket, timeout=5)
    try:
        client.post("/controller/stop", {})
    except ControllerDown:
        pass  # not answering: wait for the lock all the same, the caller may signal it
    finally:
        client.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock_holder(home) is None:
            return holder
        time.sleep(0.05)
    raise ControllerDown(f"the controller (pid {holder}) did not stop within {timeout:.0f} s; "
                         f"send it SIGTERM (kill {holder}), or SIGKILL if that fails")


def tail(home: Home, lines: int = 15, since: int = 0) -> str:
    """The last `lines` lines the log got from byte `since` on."""
    try:
        with open(home.log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(nothing in the log)"


FAULT_FILE = "controller.fault"


def write_fault(home: Home, why: str) -> str | None:
    """Record why the controller stops on a fault; None, or why it could not (the disk may be full)."""
    path = home.root / FAULT_FILE
    try:
        tmp = path.with_name(FAULT_FILE + ".tmp")
        tmp.write_text(json.dumps({"time": time.time(), "pid": os.getpid(), "why": why}) + "\n")
        tmp.replace(path)
    except OSError as err:
        return f"could not record the fault in {path}: {err}"
    return None


def read_fault(home: Home) -> dict | None:
    """Why the controller of `home` last stopped on a fault, or None (it never did, or it stopped
    cleanly since)."""
    try:
        record = json.loads((home.root / FAULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("why"), str) else None


def clear_fault(home: Home) -> None:
    with contextlib.suppress(OSError):
        (home.root / FAULT_FILE).unlink(missing_ok=True)
