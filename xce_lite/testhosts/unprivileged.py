"""Unprivileged plain hosts: sshd processes of the caller's on 127.0.0.1 and free ports."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

from xce_lite.testhosts.base import SSHD, TestHost, TestHostError, _spawned, _start_time
from xce_lite.testhosts.boot import _banner, _keygen, _log_tail, _sshd_config, _write_client_files
from xce_lite.testhosts.records import _save_records, down

# ---------------------------------------------------------------------------------------------------
# unprivileged hosts: an sshd of the caller's on 127.0.0.1 and a free port, no namespaces

UNPRIVILEGED_IP = "127.0.0.1"


def _free_port(ip: str) -> int:
    """A port free on `ip` now (the kernel's pick); sshd may still lose it to a race, which `up` retries."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def _listens(pid: int, ip: str, port: int) -> bool:
    """Whether process `pid` itself holds the socket listening on ip:port (not some other program)."""
    want = f"{socket.inet_aton(ip)[::-1].hex().upper()}:{port:04X}"
    try:
        rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        inodes = {f"socket:[{r[9]}]" for r in rows if r[1] == want and r[3] == "0A"}
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _start_sshd(name: str, dir: Path, user: str, die_with_caller: bool) -> tuple[subprocess.Popen, dict]:
    port = _free_port(UNPRIVILEGED_IP)
    config = dir / f"{name}.sshd_config"
    config.write_text(_sshd_config(f"{name}, run by {user} without root", dir, port, dir / f"{name}.hostkey",
                                   dir / f"{name}.sshd.pid", strict=False))
    argv = [SSHD, "-D", "-e", "-f", str(config), "-o", f"ListenAddress={UNPRIVILEGED_IP}"]
    if die_with_caller and shutil.which("setpriv"):  # setpriv execs sshd: the PID stays sshd's
        argv = ["setpriv", "--pdeathsig", "KILL", *argv]
    with open(dir / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd="/")
    _spawned[proc.pid] = proc
    record = {"name": name, "ip": UNPRIVILEGED_IP, "port": port, "pid": proc.pid, "start": _start_time(proc.pid),
              "systemd": False, "unprivileged": True, "user": user, "cgroups": []}
    return proc, record


def _up_unprivileged(names: list[str], dir: Path, timeout: float, die_with_caller: bool) -> list[TestHost]:
    """Start one sshd per name, recorded in `dir` as soon as it runs; wait until each listens and answers."""
    if os.geteuid() == 0:  # root's sshd wants its privilege separation directory, as its service makes it
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    user = pwd.getpwuid(os.geteuid()).pw_name
    records: list[dict] = []
    try:
        for name in names:
            _keygen(dir / f"{name}.hostkey")
        running = {}
        for name in names:
            running[name], rec = _start_sshd(name, dir, user, die_with_caller)
            records.append(rec)
            _save_records(dir, records)  # from now on `down` finds it, even if this process dies
        deadline = time.monotonic() + timeout
        retries = 3
        while running:
            for i, rec in enumerate(records):
                proc = running.get(rec["name"])
                if proc is None:
                    continue
                if proc.poll() is not None:
                    log = _log_tail(dir, rec["name"])
                    if "Address already in use" not in log or retries == 0:
                        raise TestHostError(f"{rec['name']}: sshd on {rec['ip']}:{rec['port']} exited "
                                            f"{proc.returncode}{log}")
                    retries -= 1  # another program took the port between our pick and sshd's bind
                    running[rec["name"]], records[i] = _start_sshd(rec["name"], dir, user, die_with_caller)
                    _save_records(dir, records)
                elif _listens(rec["pid"], rec["ip"], rec["port"]) and _banner(rec["ip"], rec["port"]):
                    del running[rec["name"]]
            if running and time.monotonic() > deadline:
                raise TestHostError(f"gave up after {timeout:g} s waiting for the sshd of {', '.join(running)}"
                                    f"{_log_tail(dir, next(iter(running)))}")
            if running:
                time.sleep(0.01)
    except BaseException:
        down(dir)
        raise
    started = [TestHost(r["name"], r["ip"], r["pid"], False, dir, r["port"], user, True) for r in records]
    _write_client_files(started)
    return started
