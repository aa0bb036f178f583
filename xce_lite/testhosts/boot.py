"""Booting namespaced hosts: the host script, spawning, and each boot's steps until sshd answers."""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import subprocess
import time
import uuid
from pathlib import Path

from xce_lite.testhosts.base import (
    MASKED_UNITS,
    SSH_PORT,
    SSHD,
    SSHD_CONFIG,
    SYSTEMD,
    UNIT_DIRS,
    TestHost,
    TestHostError,
    _alive,
    _children,
    _comm,
    _spawned,
    _start_time,
)
from xce_lite.testhosts.cgroups import _Hierarchy, _make_cgroups, _remove_cgroups

# ---------------------------------------------------------------------------------------------------
# booting


def _masks() -> list[str]:
    found: dict[str, None] = {}
    for unit in MASKED_UNITS:
        for d in UNIT_DIRS:
            p = Path(d) / unit
            if p.exists():
                real = os.path.realpath(p)
                if real != "/dev/null":
                    found[real] = None
    return list(found)


def _host_script(name: str, dir: Path, plain: bool, hierarchies: list[_Hierarchy]) -> str:
    q = shlex.quote
    lines = [
        "set -e",
        "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp",
        "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /var/tmp",
        "mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run",
        "mkdir -m 1777 /run/lock; mkdir -m 755 /run/sshd",
        "[ ! -d /dev/shm ] || mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm",
        f"[ ! -e /etc/hostname ] || mount --bind {q(str(dir / (name + '.hostname')))} /etc/hostname",
        f"[ ! -e /etc/machine-id ] || mount --bind {q(str(dir / (name + '.machine-id')))} /etc/machine-id",
        f"echo {q(name)} > /proc/sys/kernel/hostname",
    ]
    if plain:
        lines.append("exec sleep infinity")
        return "\n".join(lines)
    lines += [f"mount --bind /dev/null {q(p)}" for p in _masks()]
    if hierarchies:  # this namespace's own view of its cgroups, rooted at the host's subtree
        if not any(h.mountpoint == "/sys/fs/cgroup" for h in hierarchies):
            lines.append("mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs /sys/fs/cgroup")
        for h in hierarchies:
            lines.append(f"mkdir -p {q(h.mountpoint)}")
            opts = f"-o {q(h.options)} " if h.options else ""
            lines.append(f"mount -t {h.fstype} {opts}{h.fstype} {q(h.mountpoint)}")
        links = [p for p in Path("/sys/fs/cgroup").iterdir() if p.is_symlink()]
        lines += [f"ln -s {q(os.readlink(p))} {q(str(p))}" for p in sorted(links)]  # e.g. cpu -> cpu,cpuacct
    lines.append(f"exec env -i container=xce-testhost {SYSTEMD} --system --unit=basic.target")
    return "\n".join(lines)


_JOIN_CGROUPS = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n-1)); done; exec "$@"'


@dataclasses.dataclass
class _Boot:
    name: str
    ip: str
    plain: bool
    proc: subprocess.Popen
    cgroups: list[Path]
    pid: int = 0
    start: int | None = None
    stage: str = "spawned"  # spawned -> booting -> sshd -> ready
    sshd_started: float = 0.0


def _spawn(name: str, ip: str, dir: Path, plain: bool, die_with_caller: bool,
           hierarchies: list[_Hierarchy]) -> _Boot:
    (dir / f"{name}.hostname").write_text(name + "\n")
    (dir / f"{name}.machine-id").write_text(uuid.uuid4().hex + "\n")
    cgroups = [] if plain or not hierarchies else _make_cgroups(hierarchies, f"{ip}-{name}")
    namespaces = ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--uts", "--ipc",
                  "--propagation", "private"]
    if not plain:
        namespaces.insert(-2, "--cgroup")
    argv = ["unshare", *namespaces, "bash", "-c", _host_script(name, dir, plain, hierarchies if cgroups else [])]
    argv = ["sh", "-c", _JOIN_CGROUPS, "join", str(len(cgroups)), *(str(g / "cgroup.procs") for g in cgroups),
            *argv]
    if die_with_caller:  # if the caller dies, unshare gets SIGKILL, and --kill-child takes the host with it
        argv = ["setpriv", "--pdeathsig", "KILL", *argv]
    try:
        with open(dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd="/")
    except BaseException:
        _remove_cgroups(cgroups, deadline=time.monotonic() + 2)
        raise
    _spawned[proc.pid] = proc
    return _Boot(name, ip, plain, proc, cgroups)


def _log_tail(dir: Path, name: str) -> str:
    try:
        text = (dir / f"{name}.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return ("\n  " + "\n  ".join(text[-15:])) if text else ""


def _sshd_argv(dir: Path, ip: str) -> list[str]:
    return [SSHD, "-f", str(dir / "sshd_config"), "-o", f"ListenAddress={ip}"]


def _banner(ip: str, port: int = SSH_PORT) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5) as s:
            s.settimeout(1.0)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _step(b: _Boot, dir: Path) -> bool:
    """Advance one host's boot by what is ready now; True when it moved on."""
    if b.stage == "spawned":
        if b.proc.poll() is not None:
            raise TestHostError(f"{b.name} did not start (unshare exited {b.proc.returncode}){_log_tail(dir, b.name)}")
        want = "sleep" if b.plain else "systemd"
        for child in _children(b.proc.pid):
            if _comm(child) == want:
                b.pid, b.start = child, _start_time(child)
                b.stage = "booting"
                return True
        return False
    if b.stage == "booting":
        if not _alive(b.pid, b.start):
            raise TestHostError(f"{b.name}'s PID 1 ({b.pid}) died while booting{_log_tail(dir, b.name)}")
        if not b.plain:
            r = subprocess.run(["nsenter", "-t", str(b.pid), "-a", "systemctl", "is-system-running"],
                               capture_output=True, text=True, timeout=10)
            state = r.stdout.strip()
            if state in ("maintenance", "stopping"):
                raise TestHostError(f"{b.name}'s systemd is {state}{_log_tail(dir, b.name)}")
            if state not in ("running", "degraded"):
                return False
            start = ["systemd-run", "--quiet", "--unit=xce-sshd", "--description=sshd of the xce test host",
                     "-p", "Type=exec", "-p", "KillMode=process", *_sshd_argv(dir, b.ip), "-D", "-e"]
        else:
            start = _sshd_argv(dir, b.ip)
        r = subprocess.run(["nsenter", "-t", str(b.pid), "-a", *start], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            raise TestHostError(f"{b.name}: starting sshd failed: {r.stderr.strip() or r.stdout.strip()}")
        b.stage, b.sshd_started = "sshd", time.monotonic()
        return True
    if b.stage == "sshd":
        if _banner(b.ip):
            b.stage = "ready"
            return True
        if time.monotonic() - b.sshd_started > 1.0:  # tell a failed sshd from a slow one
            b.sshd_started = time.monotonic()
            if b.plain:
                failed = subprocess.run(["nsenter", "-t", str(b.pid), "-a", "test", "-e", "/run/xce-sshd.pid"]
                                        ).returncode != 0
            else:
                failed = subprocess.run(["nsenter", "-t", str(b.pid), "-a", "systemctl", "is-failed", "--quiet",
                                         "xce-sshd"]).returncode == 0
            if failed:
                journal = subprocess.run(["nsenter", "-t", str(b.pid), "-a", "journalctl", "-q", "-n", "10",
                                          "-u", "xce-sshd"], capture_output=True, text=True).stdout
                raise TestHostError(f"{b.name}: sshd on {b.ip}:22 did not start\n{journal}")
        return False
    return False


def _write_client_files(hosts: list[TestHost]) -> None:
    """DIR/known_hosts (each host's key, by name and address) and DIR/ssh_config (Host NAME ...)."""
    known, config = [], []
    for h in hosts:
        key_type, key = h.host_key_path.read_text().split()[:2]
        names = f"{h.name},{h.ip}" if h.port == SSH_PORT else f"[{h.name}]:{h.port},[{h.ip}]:{h.port}"
        known.append(f"{names} {key_type} {key}\n")
        config.append(f"Host {h.name}\n  HostName {h.ip}\n  Port {h.port}\n  User {h.user}\n"
                      f"  IdentityFile {h.key_path}\n  IdentitiesOnly yes\n  UserKnownHostsFile {h.known_hosts_path}\n"
                      f"  StrictHostKeyChecking yes\n\n")
    (hosts[0].dir / "known_hosts").write_text("".join(known))
    (hosts[0].dir / "ssh_config").write_text("".join(config))


def _keygen(path: Path) -> None:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "xce-testhosts", "-f", str(path)],
                       check=True, stdin=subprocess.DEVNULL)




def _sshd_config(which: str, dir: Path, port: int, hostkey: Path, pidfile: Path | str, strict: bool) -> str:
    return SSHD_CONFIG.format(which=which, port=port, dir=dir, hostkey=hostkey, pidfile=pidfile,
                              strict_modes="yes" if strict else "no")
