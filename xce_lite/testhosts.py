"""Test hosts: a small cluster of real hosts on one Linux machine, as root (or, without, plain sshd hosts).

Each host is a real systemd, PID 1 of its own PID, mount, UTS, IPC and cgroup namespaces, with a
real sshd listening on its own loopback address (127.0.0.11, .12, ... port 22). The file system is
shared, as on a lab with NFS homes, except /tmp, /var/tmp, /run and /dev/shm, which are private to
each host. A plain host (`plain=True`) boots no systemd: its PID 1 is `sleep infinity`, for the
engine's fallback without systemd.

    python -m xce_lite.testhosts up 3 [DIR] [--plain] [--unprivileged] [--first-ip 127.0.0.21]
    ssh -F DIR/ssh_config host1 hostname
    python -m xce_lite.testhosts status [DIR]
    python -m xce_lite.testhosts down [DIR]

Without root (or with `unprivileged=True`, `--unprivileged`, so that root can try it), a host is
only an sshd run by the caller on 127.0.0.1 and a free high port, with a host key of its own,
logging the caller in with the directory's key (AuthorizedKeysFile there, UsePAM no). It is a
plain host with NO isolation: the machine's /tmp, process table and hostname, no systemd, and
`down` stops its sshd and the sessions under it, not what those started detached from them.

From Python: `up(n, dir)` returns the hosts, `down(dir)` stops every host started in `dir`,
`status(dir)` tells which are up. `dir` must lie outside /tmp (the hosts have their own /tmp, so they
would not see it). `up` writes there: id_ed25519 (the client key), known_hosts, ssh_config (Host hostN,
User root, StrictHostKeyChecking yes), and hosts.json (what `down` and `status` read).

What keeps the machine safe (learned on Debian 12, systemd 252, cgroup v1 hybrid):
- systemd in a namespace runs systemd-tmpfiles at boot, which would WIPE THE SHARED /tmp: every host
  has a private tmpfs /tmp and /var/tmp, and the tmpfiles units are masked (/dev/null bind-mounted over
  the unit file, inside the host's mount namespace only). So are the other units that would change the
  machine rather than the host: sysctl, kernel modules, binfmt, remounting /, sysusers, the journal
  flush to /var/log/journal, the daily timers (apt, dpkg backup, e2scrub, man-db), ssh.service.
- each systemd host gets cgroups of its own (a child of the caller's, made the root of its cgroup
  namespace and mounted as its /sys/fs/cgroup); without them every host's systemd would manage the
  same machine-wide system.slice and init.scope.
- loopback addresses are claimed machine-wide in /run/xce-testhosts (and port 22 is test-bound), so
  parallel harnesses never share one. Test traffic only ever goes to 127.0.0.0/8.
- `down` stops only the hosts recorded in `dir`, by PID (checked against the process start time):
  `systemctl exit` inside the host, then SIGKILL of the namespace's PID 1, which takes all in it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

SSH_PORT = 22
DEFAULT_FIRST_IP = "127.0.0.11"
FIRST_IP_ENV = "XCE_TESTHOSTS_FIRST_IP"
CLAIMS_ENV = "XCE_TESTHOSTS_CLAIMS"
DEFAULT_CLAIMS = "/run/xce-testhosts"
DEFAULT_DIR = Path.home() / ".cache" / "xce-testhosts" / "practice"
STATE = "hosts.json"
SYSTEMD = "/lib/systemd/systemd"
SSHD = "/usr/sbin/sshd"
SSHD_INSTALL = "apt-get update && apt-get install -y openssh-server"
INSTALL_SCRIPT = Path(__file__).resolve().parent / "tests" / "install_test_deps.sh"

# Directories each host mounts a tmpfs of its own over: a host directory must not lie under them.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/run", "/dev/shm")

# Masked in every systemd host (inside its own mount namespace): each would act on the machine.
MASKED_UNITS = (
    # would wipe the SHARED /tmp at boot, and age-clean /tmp and /var/tmp every day
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-clean.timer",
    "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-setup-dev.service",  # device nodes in the machine's /dev
    # the hosts would fight over 0.0.0.0:22; each host's sshd is started by the harness
    "ssh.service",
    "ssh.socket",
    # kernel-wide settings
    "systemd-sysctl.service",
    "systemd-modules-load.service",
    "modprobe@.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
    "systemd-remount-fs.service",  # remounts the machine's root file system per /etc/fstab
    # writes to the shared /etc and /var
    "systemd-sysusers.service",
    "systemd-firstboot.service",
    "systemd-machine-id-commit.service",
    "ldconfig.service",
    "systemd-hwdb-update.service",
    "systemd-journal-catalog-update.service",
    "systemd-update-done.service",
    "systemd-random-seed.service",
    "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service",
    "systemd-journal-flush.service",  # the journal stays in the host's own /run
    "timers.target",  # apt-daily, apt-daily-upgrade, dpkg-db-backup, e2scrub_all, man-db, ...
)
UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")

SSHD_CONFIG = """\
# written by xce_lite.testhosts: the sshd of {which}
Port {port}
HostKey {hostkey}
AuthorizedKeysFile {dir}/authorized_keys
PidFile {pidfile}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# An unprivileged sshd logs in only the user it runs as: there is no other user to guard from.
StrictModes {strict_modes}
UseDNS no
PrintMotd no
X11Forwarding no
MaxSessions 64
MaxStartups 64:30:128
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
LogLevel INFO
"""

# Unshare processes this process started, so that `down` reaps them (no zombie, no ResourceWarning).
_spawned: dict[int, subprocess.Popen] = {}


class TestHostError(RuntimeError):
    """A test host could not be started or stopped; the message says why and what to do."""

    __test__ = False  # not a pytest test class


@dataclasses.dataclass(frozen=True)
class TestHost:
    """One running test host: `ssh -F {dir}/ssh_config {name}` reaches it as `user`."""

    __test__ = False  # not a pytest test class

    name: str
    ip: str
    pid: int  # PID 1 of the host's namespaces, as the caller sees it; an unprivileged host's sshd
    systemd: bool
    dir: Path
    port: int = SSH_PORT
    user: str = "root"
    unprivileged: bool = False  # only an sshd of the caller's: no namespaces (see the module's docstring)

    @property
    def mode(self) -> str:
        return "unprivileged" if self.unprivileged else "systemd" if self.systemd else "plain"

    @property
    def where(self) -> str:
        """`ip`, or `ip:port` when the port is not 22."""
        return self.ip if self.port == SSH_PORT else f"{self.ip}:{self.port}"

    @property
    def key_path(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def host_key_path(self) -> Path:
        """The public key its sshd presents."""
        return self.dir / (f"{self.name}.hostkey.pub" if self.unprivileged else "hostkey.pub")

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def ssh_config_path(self) -> Path:
        return self.dir / "ssh_config"

    def ssh_argv(self, command: str | list[str]) -> list[str]:
        """`ssh` argv running `command` (a shell string, or an argv quoted for the remote shell)."""
        if not isinstance(command, str):
            command = shlex.join(command)
        return ["ssh", "-F", str(self.ssh_config_path), "-o", "BatchMode=yes", self.name, command]

    def nsenter_argv(self, argv: list[str]) -> list[str]:
        """argv running `argv` inside the host, bypassing ssh (as root on the caller)."""
        return ["nsenter", "-t", str(self.pid), "-a", *argv]


@dataclasses.dataclass(frozen=True)
class HostStatus:
    host: TestHost
    alive: bool  # the namespace's PID 1 still runs
    sshd: bool  # an SSH server answers on host.ip:host.port

    def line(self) -> str:
        h = self.host
        state = "up" if self.alive and self.sshd else ("no-sshd" if self.alive else "down")
        return f"{h.name} {h.where} pid={h.pid} {h.mode} {state}"


# ---------------------------------------------------------------------------------------------------
# processes


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot): with the PID, it names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, start: int | None) -> bool:
    """Whether that process still runs (a zombie does not: an unprivileged host's sshd is our child)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (start is None or int(fields[19]) == start)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def namespace_pids(pid: int) -> list[int]:
    """Every process (as the caller sees it) in the PID namespace whose PID 1 is `pid`."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                    found.append(int(entry))
    return found


# ---------------------------------------------------------------------------------------------------
# checks


def missing_prerequisites(plain: bool = False, unprivileged: bool = False) -> list[str]:
    """What keeps test hosts from starting here, each with its remedy; empty when nothing does.

    `unprivileged`: hosts that are only sshd processes of the caller's, which need neither root nor
    namespaces (and are always plain)."""
    problems = []
    if sys.platform != "linux":
        return ["test hosts need Linux (/proc)" if unprivileged else "test hosts need Linux (namespaces)"]
    if os.geteuid() != 0 and not unprivileged:
        problems.append("test hosts need root (namespaces, mounts, sshd on port 22); without root, "
                        "plain unprivileged hosts can run (plain=True, or --plain)")
    for tool in () if unprivileged else ("unshare", "nsenter", "setpriv"):
        if not shutil.which(tool):
            problems.append(f"{tool} is missing: apt-get install -y util-linux")
    if not os.access(SSHD, os.X_OK):
        hint = f" (or bash {INSTALL_SCRIPT})" if INSTALL_SCRIPT.exists() else ""
        problems.append(f"sshd is missing: {SSHD_INSTALL}{hint}")
    if not shutil.which("ssh-keygen"):
        problems.append("ssh-keygen is missing: apt-get install -y openssh-client")
    if not plain and not unprivileged and not os.access(SYSTEMD, os.X_OK):
        problems.append(f"{SYSTEMD} is missing: apt-get install -y systemd (or use plain hosts)")
    return problems


def _check_dir(dir: Path | str) -> Path:
    path = Path(os.path.realpath(Path(dir).expanduser()))
    for private in PRIVATE_DIRS:
        if path == Path(private) or Path(private) in path.parents:
            raise TestHostError(
                f"the host directory {path} lies under {private}, which each host has a private copy of: "
                "choose one outside /tmp, /var/tmp, /run and /dev/shm (e.g. ~/.cache/xce-testhosts/NAME)"
            )
    return path


def _root_locked() -> bool:
    """sshd with UsePAM=no refuses keys for an account whose password is locked ('!' in /etc/shadow)."""
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            if line.startswith("root:"):
                return line.split(":")[1].startswith("!")
    except OSError:
        pass
    return False


# ---------------------------------------------------------------------------------------------------
# loopback addresses, claimed machine-wide


def _claims_dir() -> Path:
    return Path(os.environ.get(CLAIMS_ENV, DEFAULT_CLAIMS))


@contextlib.contextmanager
def _claims_locked() -> Iterator[Path]:
    d = _claims_dir()
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield d


def _claim_owner_alive(claim: Path) -> bool:
    try:
        data = json.loads(claim.read_text())
        return _alive(int(data["pid"]), data.get("start"))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _port_free(ip: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, SSH_PORT))
        except OSError:
            return False
    return True


def _wildcard_ssh_listener() -> bool:
    """Something (a system sshd?) listens on 0.0.0.0:22, which takes port 22 on every loopback address."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(f.split()[1] == "00000000:0016" and f.split()[3] == "0A" for f in lines)


def _parse_first_ip(first_ip: str | int | None) -> ipaddress.IPv4Address | None:
    if first_ip is None or first_ip == "":
        return None
    text = str(first_ip)
    if text.isdigit():  # as the recipe's TESTHOSTS_FIRST_IP: the last number, 21 -> 127.0.0.21
        text = f"127.0.0.{text}"
    ip = ipaddress.IPv4Address(text)
    if not ip.is_loopback:
        raise TestHostError(f"test hosts only use loopback addresses (127.0.0.0/8), not {ip}")
    return ip


def _usable(ip: ipaddress.IPv4Address) -> bool:
    last = int(ip) & 0xFF
    return ip.is_loopback and 0 < last < 255 and ip != ipaddress.IPv4Address("127.0.0.1")


def _write_claim(path: Path, dir: Path, pid: int) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(json.dumps({"dir": str(dir), "pid": pid, "start": _start_time(pid)}))
    os.replace(tmp, path)


def _why_taken(claims: Path, ip: str, dir: Path) -> str | None:
    """Why `ip` is not free for the hosts of `dir`, or None when it is."""
    claim = claims / ip
    if claim.exists():
        try:
            data = json.loads(claim.read_text())
        except (OSError, ValueError):
            data = {}
        if data.get("dir") != str(dir) and _claim_owner_alive(claim):
            return f"the test hosts of {data.get('dir')} claim it"
    if not _port_free(ip):
        why = "port 22 on it is in use"
        if _wildcard_ssh_listener():
            why += (" (something listens on 0.0.0.0:22, a system sshd? It takes port 22 on every loopback "
                    "address: stop it, e.g. systemctl disable --now ssh.service)")
        return why
    return None


def claim_ips(n: int, dir: Path, first_ip: str | int | None = None) -> list[str]:
    """Claim n consecutive free loopback addresses for the hosts of `dir`.

    With `first_ip` the block starts exactly there (or this raises); without, it is the first free
    block from $XCE_TESTHOSTS_FIRST_IP or 127.0.0.11 up. An address is free when no live harness
    claims it and port 22 on it can be bound. The claim is this process's until `up` hands it to
    the host.
    """
    explicit = _parse_first_ip(first_ip)
    start = explicit or _parse_first_ip(os.environ.get(FIRST_IP_ENV)) or ipaddress.IPv4Address(DEFAULT_FIRST_IP)
    last = ipaddress.IPv4Address("127.255.255.254")
    with _claims_locked() as claims:
        ip = start
        block: list[str] = []
        while len(block) < n:
            if ip > last:
                raise TestHostError(f"no block of {n} free loopback addresses from {start} on")
            if _usable(ip):
                why = _why_taken(claims, str(ip), dir)
                if why is None:
                    block.append(str(ip))
                elif explicit is not None:
                    raise TestHostError(f"{ip} is not free for test hosts: {why}")
                elif "0.0.0.0:22" in why:
                    raise TestHostError(f"no loopback address is free for test hosts: {why}")
                else:
                    block = []  # a block is consecutive: start again after this one
            elif explicit is not None:
                raise TestHostError(f"{ip} cannot be a test host's address (127.0.0.1, or a last number 0 or 255)")
            else:
                block = []
            ip += 1
        for a in block:
            _write_claim(claims / a, dir, os.getpid())
        return block


def release_ips(dir: Path, ips: list[str]) -> None:
    """Give back the addresses `claim_ips` claimed for the hosts of `dir`."""
    if not ips:
        return  # and without root, touch no claims directory
    with _claims_locked() as claims:
        for ip in ips:
            claim = claims / ip
            with contextlib.suppress(OSError, ValueError):
                if json.loads(claim.read_text()).get("dir") == str(dir):
                    claim.unlink()


def _hand_claims(dir: Path, owners: dict[str, int]) -> None:
    with _claims_locked() as claims:
        for ip, pid in owners.items():
            _write_claim(claims / ip, dir, pid)


# ---------------------------------------------------------------------------------------------------
# cgroups: each systemd host gets a subtree of its own, the root of its cgroup namespace


@dataclasses.dataclass(frozen=True)
class _Hierarchy:
    mountpoint: str  # where the caller sees it, e.g. /sys/fs/cgroup/memory
    fstype: str  # cgroup or cgroup2
    options: str  # for mounting it again inside the host (v1: its controllers or name=)
    path: str  # the caller's cgroup in it


def _hierarchies() -> list[_Hierarchy]:
    """The cgroup hierarchies mounted under /sys/fs/cgroup, with the caller's cgroup in each."""
    mine: dict[frozenset[str], str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        mine[frozenset(controllers.split(",")) if controllers else frozenset()] = path
    subsystems = {line.split()[0] for line in Path("/proc/cgroups").read_text().splitlines()[1:] if line.strip()}
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields = left.split()
        fstype, _source, super_opts = right.split()[:3]
        mountpoint = fields[4]
        if fstype not in ("cgroup", "cgroup2") or not mountpoint.startswith("/sys/fs/cgroup"):
            continue
        if fields[3] != "/":
            raise TestHostError(f"cgroup hierarchy {mountpoint} is not mounted at its root ({fields[3]})")
        if fstype == "cgroup2":
            key: frozenset[str] = frozenset()
            options = ""
        else:  # v1: the hierarchy is named by its controllers (or name=), which mounting it again needs
            key = frozenset(o for o in super_opts.split(",") if o in subsystems or o.startswith("name="))
            options = ",".join(sorted(key) + (["none"] if all(o.startswith("name=") for o in key) else []))
        if key in mine:
            found.append(_Hierarchy(mountpoint, fstype, options, mine[key]))
    if not found:
        raise TestHostError("no cgroup hierarchy is mounted under /sys/fs/cgroup")
    return found


def _make_cgroups(hierarchies: list[_Hierarchy], leaf: str) -> list[Path]:
    """Create BASE/xce-testhosts/`leaf` in each hierarchy, and return them.

    BASE is the caller's cgroup: the hosts stay within its limits and its bookkeeping. Except on a
    cgroup v2 hierarchy that has controllers: a cgroup with processes (the caller's) cannot hand
    controllers down, so there BASE is the root, and xce-testhosts delegates what it has to the hosts.
    """
    made: list[Path] = []
    try:
        for h in hierarchies:
            mount = Path(h.mountpoint)
            v2_controllers = h.fstype == "cgroup2" and (mount / "cgroup.controllers").read_text().split()
            if h.path.startswith("/..") and not v2_controllers:
                raise TestHostError(f"the caller's cgroup {h.path} lies outside its cgroup namespace")
            base = (mount if v2_controllers else mount / h.path.lstrip("/")) / "xce-testhosts"
            for d in (base, base / leaf):
                d.mkdir(exist_ok=True)
                for f in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset takes no task before these are set
                    if (d / f).exists() and not (d / f).read_text().strip():
                        (d / f).write_text((d.parent / f).read_text())
                if v2_controllers and d == base:
                    for c in (base / "cgroup.controllers").read_text().split():
                        with contextlib.suppress(OSError):
                            (base / "cgroup.subtree_control").write_text(f"+{c}")
            made.append(base / leaf)
        return made
    except BaseException:
        _remove_cgroups(made, deadline=time.monotonic() + 2)
        raise


def _remove_cgroups(groups: list[Path], deadline: float) -> list[Path]:
    """Remove these cgroups with all under them (bottom up); return those still there at the deadline."""
    left = []
    for group in groups:
        while group.exists():
            try:
                for root, dirs, _files in os.walk(group, topdown=False):
                    for d in dirs:
                        with contextlib.suppress(FileNotFoundError):
                            os.rmdir(os.path.join(root, d))
                os.rmdir(group)
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                    left.append(group)
                    break
                time.sleep(0.02)
        with contextlib.suppress(OSError):  # the xce-testhosts parent, when no other host uses it
            group.parent.rmdir()
    return left


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


def _sshd_config(which: str, dir: Path, port: int, hostkey: Path, pidfile: Path | str, strict: bool) -> str:
    return SSHD_CONFIG.format(which=which, port=port, dir=dir, hostkey=hostkey, pidfile=pidfile,
                              strict_modes="yes" if strict else "no")


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
# command line


@dataclasses.dataclass(frozen=True)
class HostUser:
    """A non-root user with a lingering systemd user manager, inside one systemd test host only."""

    __test__ = False  # not a pytest test class

    host: TestHost
    name: str
    uid: int
    home: str  # the home as the host sees it: /run/xce-home/NAME
    files: Path  # the same directory as this machine sees it (under the caller's directory)

    @property
    def runtime_dir(self) -> str:
        return f"/run/user/{self.uid}"

    def argv(self, argv: list[str]) -> list[str]:
        """argv running `argv` inside the host as this user, with a login-like environment."""
        env = [f"HOME={self.home}", f"USER={self.name}", f"LOGNAME={self.name}", "PATH=/usr/bin:/bin",
               f"XDG_RUNTIME_DIR={self.runtime_dir}", "LANG=C.UTF-8"]
        return self.host.nsenter_argv(["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                                       "env", "-i", *env, *argv])


def add_lingering_user(host: TestHost, name: str, dir: Path | str, uid: int = 2001,
                       timeout: float = 30.0) -> HostUser:
    """Give the systemd test host `host` a user `name` (uid = gid = `uid`) whose systemd user manager
    lingers (`loginctl enable-linger`), for jobs in user units. Changes nothing on this machine.

    Inside the host's own mount namespace only, private copies (kept in `dir`) are bind-mounted over
    /etc/passwd, /etc/group and /etc/shadow, and an empty directory over /var/lib/systemd, where
    logind records lingering users. The home is `dir`/NAME-home, bind-mounted at /run/xce-home/NAME
    inside the host (its /run is private): a home under this machine's /root (mode 0700), where test
    directories usually are, would be out of the user's reach. `dir` must lie outside /tmp.
    Raises TestHostError if the user manager does not answer within `timeout` seconds.
    """
    if not host.systemd:
        raise TestHostError(f"{host.name} has no systemd: a lingering user needs a systemd host")
    dir = _check_dir(dir)
    dir.mkdir(parents=True, exist_ok=True)
    files, home = dir / f"{name}-home", f"/run/xce-home/{name}"
    files.mkdir(exist_ok=True)
    os.chown(files, uid, uid)
    lines = {
        "passwd": f"{name}:x:{uid}:{uid}:{name}:{home}:/bin/sh\n",
        "group": f"{name}:x:{uid}:\n",
        "shadow": f"{name}:*:19000:0:99999:7:::\n",
    }
    var_lib = dir / "var-lib-systemd"
    (var_lib / "linger").mkdir(parents=True, exist_ok=True)
    script = ["set -e"]
    for base, line in lines.items():
        copy = dir / f"{host.name}.{base}"
        text = Path(f"/etc/{base}").read_text()
        if not any(entry.split(":", 1)[0] == name for entry in text.splitlines()):
            text += line
        copy.write_text(text)
        os.chmod(copy, 0o640 if base == "shadow" else 0o644)
        script.append(f"mountpoint -q /etc/{base} || mount --bind {shlex.quote(str(copy))} /etc/{base}")
    script += [
        f"mountpoint -q /var/lib/systemd || mount --bind {shlex.quote(str(var_lib))} /var/lib/systemd",
        f"mkdir -p {home}",
        f"mountpoint -q {home} || mount --bind {shlex.quote(str(files))} {home}",
    ]
    for argv in (["sh", "-c", "\n".join(script)], ["loginctl", "enable-linger", name]):
        done = subprocess.run(host.nsenter_argv(argv), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise TestHostError(f"{host.name}: {shlex.join(argv[:2])} failed: {done.stderr.strip()}")
    user = HostUser(host, name, uid, home, files)
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(user.argv(["systemctl", "--user", "is-system-running"]), capture_output=True,
                              text=True, timeout=timeout)
        if done.stdout.strip() in ("running", "degraded"):
            return user
        if time.monotonic() > deadline:
            raise TestHostError(f"{host.name}: the user manager of {name} did not come up within {timeout:g} s "
                                f"({done.stdout.strip()} {done.stderr.strip()})")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xce_lite.testhosts",
        description="A practice cluster on this machine: real hosts (systemd + sshd) on loopback addresses, "
                    "as root; without root, plain hosts that are sshd processes of yours (no isolation).",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start host1..hostN")
    p_up.add_argument("n", type=int)
    p_up.add_argument("dir", nargs="?", default=str(DEFAULT_DIR), help=f"outside /tmp (default {DEFAULT_DIR})")
    p_up.add_argument("--plain", action="store_true", help="hosts without systemd (PID 1 is sleep)")
    p_up.add_argument("--unprivileged", action="store_true",
                      help="plain hosts that are only sshd processes of yours (the default without root)")
    p_up.add_argument("--first-ip", default=None, help="host1's address, e.g. 127.0.0.21 (default: first free)")
    p_up.add_argument("--timeout", type=float, default=60.0)
    for name, text in (("down", "stop every host started in DIR"), ("status", "show the hosts of DIR")):
        p = sub.add_parser(name, help=text)
        p.add_argument("dir", nargs="?", default=str(DEFAULT_DIR))
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            t0 = time.monotonic()
            started = up(args.n, args.dir, plain=args.plain or args.unprivileged, first_ip=args.first_ip,
                         timeout=args.timeout, unprivileged=True if args.unprivileged else None)
            for h in started:
                print(f"{h.name} {h.where} pid={h.pid} {h.mode}")
            d = started[0].dir
            print(f"up in {time.monotonic() - t0:.2f} s. Try: ssh -F {d}/ssh_config {started[0].name} hostname")
            print(f"Stop with: python -m xce_lite.testhosts down {d}")
        elif args.cmd == "down":
            down(args.dir)
        else:
            found = status(args.dir)
            for s in found:
                print(s.line())
            if not found:
                print(f"no test hosts in {args.dir}")
    except TestHostError as e:
        print(f"testhosts: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
