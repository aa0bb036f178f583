"""The host's facts and the ways it can run units (modes), for `serve` and its hello. Reads only:
a failing probe (no nvidia-smi, no manager) is a fact with the reason, never an error."""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from typing import Any

import os

from .dbus import MANAGER, MANAGER_PATH, PROPERTIES, Bus, DBusError, manager_socket
from .util import read_text
from .validate import SYSTEMD_PATH_CHARS


def which(name: str, path: str | None = None) -> str | None:
    for d in (path if path is not None else os.environ.get("PATH", os.defpath)).split(os.pathsep):
        candidate = os.path.join(d or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_command(argv: list[str], env: dict | None = None, timeout: float = 10.0) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of a short command; status None if it could not run or finish."""
    import subprocess  # only in `serve`, and only for the rare commands (systemctl, nvidia-smi)

    try:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "", str(exc)
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


def cgroup_version() -> str | None:
    """"v2" (unified), "hybrid" (v1 controllers, v2 at /sys/fs/cgroup/unified), "v1", or None."""
    mounts: dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) > 4 and right:
                    mounts[fields[4]] = right.split()[0]  # a later mount hides an earlier one
    except OSError:
        return None
    if mounts.get("/sys/fs/cgroup") == "cgroup2":
        return "v2"
    if mounts.get("/sys/fs/cgroup/unified") == "cgroup2":
        return "hybrid"
    return "v1" if "cgroup" in mounts.values() else None


def gpus() -> list[dict]:
    """The host's NVIDIA GPUs as nvidia-smi lists them ([] without nvidia-smi, or if it fails):
    [{"index", "name", "memory" (bytes)}]."""
    exe = which("nvidia-smi")
    if exe is None:
        return []
    code, out, _err = run_command([exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"])
    found = []
    for line in out.splitlines() if code == 0 else ():
        parts = [p.strip() for p in line.split(",")]
        try:
            found.append({"index": int(parts[0]), "name": ",".join(parts[1:-1]), "memory": int(float(parts[-1])) << 20})
        except (ValueError, IndexError):
            continue  # a line that is no GPU ("[N/A]", a warning): never fail because of it
    return found


def user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER") or str(os.getuid())


def unsafe_for_systemd(paths: dict[str, str]) -> str | None:
    """Why one of `paths` cannot go on a unit's command line, or None."""
    for what, path in paths.items():
        bad = sorted(set(path) - SYSTEMD_PATH_CHARS)
        if bad or not os.path.isabs(path):
            return (
                f"the {what} path {path!r} has characters systemd would split or expand in a unit's command "
                f"line ({''.join(bad)!r}): use a path of letters, digits and /_.,:+=@- only"
            )
    return None


def probe_modes(paths: dict[str, str], cgroup: str | None) -> tuple[dict, dict]:
    """What each way of running units needs, and whether this host has it: ({mode: {"ok", "why",
    "memory", "direct"}}, {"systemd": the manager's version or None, "env": the environment (with
    XDG_RUNTIME_DIR), "tools": {"flock", "sync"}: their paths, or None if a direct unit's
    ExecStopPost cannot have them}). `paths` (what -> path) must be fit for a unit's command line
    (unsafe_for_systemd).

    `systemd` (system units): root, systemd is PID 1 of this host (/run/systemd/system) and its
    manager answers on its private socket. `user`: a lingering user manager reachable through
    $XDG_RUNTIME_DIR (set to /run/user/UID when unset). `memory` says who enforces a memory limit:
    "systemd" (MemoryMax) or "supervisor" (its RSS watch), where systemd cannot (user managers on
    cgroup v1 get no memory controller, and systemd ignores MemoryMax there without a word).
    `direct` says whether jobs can be their unit's main process (with /bin/sh, flock and sync; see
    systemd.EXEC_SCRIPT); "direct_why" why not.
    """
    uid, user, env = os.getuid(), user_name(), dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", f"/run/user/{uid}")
    tools = {name: which(name, "/usr/bin:/bin") for name in ("flock", "sync")}
    missing = sorted(name for name, path in tools.items() if path is None or set(path) - SYSTEMD_PATH_CHARS)
    if not os.path.exists("/bin/sh"):
        missing.insert(0, "/bin/sh")
    direct_why = f"{' and '.join(missing)} missing (in /usr/bin and /bin): jobs run under the supervisor" if (
        missing) else None
    facts: dict[str, Any] = {"systemd": None, "env": env, "tools": None if missing else tools}
    unsafe = unsafe_for_systemd(paths)

    def manager(mode: str) -> str | None:
        """Why the manager cannot serve (None if it can); notes its version."""
        path = manager_socket(mode, env)
        try:
            bus = Bus(path)
            try:
                version = bus.call("Get", "ss", (MANAGER, "Version"), path=MANAGER_PATH, interface=PROPERTIES)
            finally:
                bus.close()
        except (OSError, DBusError) as exc:
            return f"the {'user' if mode == 'user' else 'system'} manager does not answer on {path}: {exc}"
        facts["systemd"] = facts["systemd"] or str(version[0][1]) or None
        return unsafe

    why: str | None
    if uid != 0:
        why = f"system units need root, and this agent runs as {user} (uid {uid}): use mode user"
    elif not os.path.isdir("/run/systemd/system"):
        why = "systemd is not this host's init (no /run/systemd/system): use mode plain"
    else:
        why = manager("systemd")
    memory = "systemd" if (cgroup in ("v1", "hybrid") and os.path.isdir("/sys/fs/cgroup/memory")) or (
        cgroup == "v2" and "memory" in (read_text("/sys/fs/cgroup/cgroup.controllers") or "").split()
    ) else "supervisor"
    modes = {"systemd": {"ok": why is None, "why": why, "memory": memory, "direct": direct_why is None}}
    if memory == "supervisor":
        modes["systemd"]["memory_why"] = (
            f"cgroup {cgroup}: no memory controller here, so the supervisor's RSS watch enforces memory limits"
        )

    runtime = env["XDG_RUNTIME_DIR"]
    if not os.path.isdir(runtime):
        why = f"XDG_RUNTIME_DIR {runtime} does not exist: {user} has no user manager running"
        why += f" (run `loginctl enable-linger {user}` as root)"
    elif not os.path.exists(f"/var/lib/systemd/linger/{user}"):
        why = f"no lingering user manager for {user}: run `loginctl enable-linger {user}`"
        why += " (without it, the manager and every job under it stop soon after the last login ends)"
    else:
        why = manager("user")
    delegated = read_text(f"/sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service/cgroup.controllers")
    memory = "systemd" if cgroup == "v2" and "memory" in (delegated or "").split() else "supervisor"
    modes["user"] = {"ok": why is None, "why": why, "memory": memory, "direct": direct_why is None}
    if memory == "supervisor":
        modes["user"]["memory_why"] = (
            f"cgroup {cgroup}: the user manager has no memory controller, so systemd would ignore MemoryMax; "
            "the supervisor's RSS watch enforces memory limits"
        )
    if direct_why:
        modes["systemd"]["direct_why"] = modes["user"]["direct_why"] = direct_why
    modes["plain"] = {"ok": True, "why": None, "memory": "supervisor", "direct": False}
    return modes, facts
