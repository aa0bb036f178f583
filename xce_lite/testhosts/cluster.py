"""`up`: boot N hosts in a directory, whatever their kind, and record them."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from xce_lite.testhosts.base import (
    SSH_PORT,
    STATE,
    TestHost,
    TestHostError,
    _check_dir,
    _root_locked,
    missing_prerequisites,
)
from xce_lite.testhosts.boot import _Boot, _keygen, _log_tail, _spawn, _sshd_config, _step, _write_client_files
from xce_lite.testhosts.cgroups import _hierarchies, _Hierarchy
from xce_lite.testhosts.claims import _hand_claims, claim_ips, release_ips
from xce_lite.testhosts.records import _save, down, status
from xce_lite.testhosts.unprivileged import _up_unprivileged


def up(n: int, dir: Path | str, plain: bool = False, first_ip: str | int | None = None, timeout: float = 60.0,
       die_with_caller: bool = False, unprivileged: bool | None = None, prefix: str = "host") -> list[TestHost]:
    """Start host1..hostN (`prefix` + number), recorded in `dir`, and wait until each one's sshd answers.

    `first_ip`: host1's address (or its last number, as 21); default: the first free block from
    127.0.0.11 (or $XCE_TESTHOSTS_FIRST_IP) up. `die_with_caller`: the hosts die with this process (for
    tests: nothing outlives a killed pytest). `unprivileged`: hosts that are only sshd processes of the
    caller's (see the module's docstring); None: so when the caller is not root. They are plain: without
    root, `plain` must be asked for. Raises TestHostError, having stopped what it started.
    """
    if n < 1:
        raise TestHostError("n must be at least 1")
    dir = _check_dir(dir)
    if unprivileged is None:
        unprivileged = os.geteuid() != 0
    if unprivileged and not plain:
        raise TestHostError("hosts with systemd need root (namespaces); without root, start plain hosts "
                            "(plain=True, or --plain): unprivileged sshd processes of yours")
    problems = missing_prerequisites(plain, unprivileged)
    if problems:
        raise TestHostError("cannot start test hosts: " + "; ".join(problems))
    if os.geteuid() == 0 and _root_locked():
        raise TestHostError("root's password is locked ('!' in /etc/shadow), and the hosts' sshd (UsePAM no) "
                            "refuses keys for locked accounts: unlock it, e.g. usermod -p '*' root")
    dir.mkdir(parents=True, exist_ok=True)
    if (dir / STATE).exists():
        alive = [s.host.name for s in status(dir) if s.alive]
        if alive:
            raise TestHostError(f"{dir} already has hosts up ({', '.join(alive)}): down it first")
        down(dir)
    _keygen(dir / "id_ed25519")
    shutil.copyfile(dir / "id_ed25519.pub", dir / "authorized_keys")
    os.chmod(dir / "authorized_keys", 0o600)
    names = [f"{prefix}{i}" for i in range(1, n + 1)]
    if unprivileged:
        return _up_unprivileged(names, dir, timeout, die_with_caller)
    _keygen(dir / "hostkey")
    (dir / "sshd_config").write_text(_sshd_config("every test host in this directory", dir, SSH_PORT,
                                                  dir / "hostkey", "/run/xce-sshd.pid", strict=True))

    ips = claim_ips(n, dir, first_ip)
    hierarchies: list[_Hierarchy] = []
    if not plain:
        try:
            hierarchies = _hierarchies()
        except (OSError, ValueError, TestHostError) as e:
            release_ips(dir, ips)
            raise TestHostError(f"cannot give systemd hosts cgroups of their own ({e}); plain hosts need none")
    boots: list[_Boot] = []
    t0 = time.monotonic()
    try:
        for name, ip in zip(names, ips):
            boots.append(_spawn(name, ip, dir, plain, die_with_caller, hierarchies))
        deadline = t0 + timeout
        while any(b.stage != "ready" for b in boots):
            moved = False
            for b in boots:
                if _step(b, dir):
                    moved = True
                    if b.stage == "booting":
                        _save(dir, boots)  # from now on `down` finds it, even if this process dies
            if time.monotonic() > deadline:
                late = ", ".join(f"{b.name} ({b.stage})" for b in boots if b.stage != "ready")
                raise TestHostError(f"gave up after {timeout:g} s waiting for {late}"
                                    f"{_log_tail(dir, next(b.name for b in boots if b.stage != 'ready'))}")
            if not moved:
                time.sleep(0.01)
    except BaseException:
        for b in boots:
            if not b.pid and b.proc.poll() is None:
                b.proc.kill()  # PID 1 not found yet: --kill-child takes it with unshare
        _save(dir, boots)
        down(dir)
        release_ips(dir, ips)
        raise
    _save(dir, boots)
    _hand_claims(dir, {b.ip: b.pid for b in boots})
    started = [TestHost(b.name, b.ip, b.pid, not b.plain, dir) for b in boots]
    _write_client_files(started)
    return started
