"""What a host directory records (hosts.json), and reading it: hosts, status and down."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from xce_lite.testhosts.base import (
    SSH_PORT,
    STATE,
    HostStatus,
    TestHost,
    TestHostError,
    _alive,
    _children,
    _comm,
    _spawned,
    _start_time,
)
from xce_lite.testhosts.boot import _banner, _Boot
from xce_lite.testhosts.cgroups import _remove_cgroups
from xce_lite.testhosts.claims import release_ips


def _save(dir: Path, boots: list[_Boot]) -> None:
    _save_records(dir, [
        {"name": b.name, "ip": b.ip, "pid": b.pid, "start": b.start, "systemd": not b.plain,
         "unshare_pid": b.proc.pid, "cgroups": [str(g) for g in b.cgroups]}
        for b in boots
    ])


def _save_records(dir: Path, records: list[dict]) -> None:
    tmp = dir / (STATE + ".new")
    tmp.write_text(json.dumps({"hosts": records}, indent=1) + "\n")
    os.replace(tmp, dir / STATE)




def _descendants(pid: int) -> list[tuple[int, int | None]]:
    """(pid, start time) of every process under `pid`, children before their own children."""
    found, todo = [], _children(pid)
    while todo:
        child = todo.pop(0)
        found.append((child, _start_time(child)))
        todo += _children(child)
    return found


def _load(dir: Path) -> list[dict]:
    try:
        return json.loads((dir / STATE).read_text())["hosts"]
    except FileNotFoundError:
        return []


def hosts(dir: Path | str) -> list[TestHost]:
    """The hosts recorded in `dir` (running or not)."""
    d = Path(os.path.realpath(Path(dir).expanduser()))
    return [TestHost(h["name"], h["ip"], h["pid"], h["systemd"], d, h.get("port", SSH_PORT), h.get("user", "root"),
                     h.get("unprivileged", False)) for h in _load(d)]


def status(dir: Path | str) -> list[HostStatus]:
    """Each host recorded in `dir`, and whether its PID 1 and its sshd are up."""
    d = Path(os.path.realpath(Path(dir).expanduser()))
    out = []
    for h, rec in zip(hosts(d), _load(d)):
        alive = bool(rec["pid"]) and _alive(rec["pid"], rec.get("start"))
        out.append(HostStatus(h, alive, alive and _banner(h.ip, h.port)))
    return out


def down(dir: Path | str, timeout: float = 10.0) -> None:
    """Stop every host recorded in `dir`: `systemctl exit` inside, then SIGKILL of its PID 1, by PID.

    An unprivileged host's sshd is killed with the sessions under it (each by PID and start time)."""
    d = Path(os.path.realpath(Path(dir).expanduser()))
    recs = _load(d)
    if not recs:
        return
    live = [r for r in recs if r["pid"] and _alive(r["pid"], r.get("start"))]
    exits = []
    for r in live:
        if r["systemd"] and _comm(r["pid"]) == "systemd":
            exits.append(subprocess.Popen(["nsenter", "-t", str(r["pid"]), "-a", "systemctl", "exit"],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
    for p in exits:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    deadline = time.monotonic() + (timeout if exits else 0)
    while any(_alive(r["pid"], r.get("start")) for r in live) and time.monotonic() < deadline:
        time.sleep(0.01)  # `systemctl exit` returns before systemd has stopped
    # PID 1 of a namespace takes everything in it along; an unprivileged sshd leaves its sessions alive
    victims = {r["name"]: [(r["pid"], r.get("start")), *(_descendants(r["pid"]) if r.get("unprivileged") else [])]
               for r in live}
    for pid, start in (v for group in victims.values() for v in group):
        if _alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(*v) for group in victims.values() for v in group) and time.monotonic() < deadline:
        time.sleep(0.01)
    stuck = [name for name, group in victims.items() if any(_alive(*v) for v in group)]
    for r in recs:
        for spawned in (r.get("unshare_pid"), r["pid"]):
            proc = _spawned.pop(spawned or 0, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=timeout)
    left = _remove_cgroups([Path(g) for r in recs for g in r.get("cgroups", [])], time.monotonic() + timeout)
    release_ips(d, [r["ip"] for r in recs if not r.get("unprivileged")])
    if stuck:
        raise TestHostError(f"hosts still running after SIGKILL: {', '.join(stuck)}")
    if left:
        raise TestHostError(f"cgroups left behind: {', '.join(map(str, left))}")
    (d / STATE).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------
