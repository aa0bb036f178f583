"""The test hosts' shared values: constants, the host records, process helpers and the checks
that say what keeps hosts from starting here."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
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
INSTALL_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "install_test_deps.sh"

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


def kill_tree(pid: int) -> None:
    """SIGKILL a process we started and all its descendants (a supervisor and its job), the
    descendants found first so that none is re-parented out of reach meanwhile."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    victims, todo = [], [pid]
    while todo:  # every thread's children, not only the main thread's
        current = todo.pop()
        victims.append(current)
        todo.extend(children.get(current, ()))
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, 9)


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
