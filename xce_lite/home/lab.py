"""The practice cluster: real SSH hosts on this machine, registered in a cluster home (`xce lab`).

`up` boots N hosts with the test-host harness (xce_lite.testhosts) and registers them in the home:
- as root, each host has its own namespaces (PID, mount, UTS; private /tmp) and sshd on its own
  loopback address, with systemd as its PID 1, or none with `plain`;
- without root (or with `unprivileged`), each host is only an sshd run by the user on 127.0.0.1 and
  a free high port, with its own host key: plain, and NOT isolated (the machine's /tmp, process
  table and hostname; no systemd). `UNPRIVILEGED_NOTE` says so wherever a user reads about it.
The hosts live in a directory outside /tmp (they would not share /tmp): <home>/lab, or, for a home
under /tmp, ~/.cache/xce-testhosts/lab-<hash of the home's path>.

What registering writes, and `down` removes again, exactly (besides what the hosts' agents keep in
`~/.xce-agent/CLUSTER-labN`, which `down` removes too):
- `xce.yaml`: one `type: ssh` host per lab host, named lab1..labN, with address, port, user and
  identity (the lab's key) written out, so no SSH config file is needed and the cluster's `ssh.config`
  stays the user's; `tags: [lab]` marks them (`-R "select[lab]"`); `launch` says the host's kind.
  Slots and memory are small and fixed (SLOTS, MEM): the hosts share this one machine, so sizing each
  like the machine would promise N times what there is, and fixed values place a lesson's jobs
  the same way on every laptop.
- `<home>/known_hosts`: each host's key, as `addr` (port 22) or `[addr]:port`.
- `<home>/lab.json`: the lab's directory, host names, kind and known_hosts lines, written before
  anything is booted, so that `down` can always undo what a crashed `up` left.

In a shared home (`mode: shared`, home/shared.py) the hosts are a lab's: their agents log in as root
(so jobs run as their submitters: the hosts share this machine's /etc/passwd, so they know its users),
`up` needs root and refuses `unprivileged`, and each agent keeps its directory in <lab dir>/agents
(0711) rather than in root's ~ (0700), where the users' jobs could not reach their own job directories.

Invariants: `up` either completes or leaves no process, no config entry and no known_hosts line of
its own behind; `up` with the lab already up changes nothing; `down` touches only what lab.json
names (and, in xce.yaml, only hosts still tagged `lab`), and stops processes only by their recorded PID.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from xce_lite import testhosts
from xce_lite.config.cluster import load_config
from xce_lite.errors import ConfigError, XceError
from xce_lite.home import clusters, config_edit
from xce_lite.home.paths import Home

LAB_TAG = "lab"
NAME_PREFIX = "lab"
SLOTS = 2
MEM = "1G"
STATE = "lab.json"
AGENTS = "agents"  # a shared lab's agent directories, in the lab's directory
COMMENT = "practice host: `xce lab down` removes it"
UNPRIVILEGED_NOTE = (
    "These hosts are sshd processes run by you, not machines of their own: they share this machine's "
    "/tmp, process table and hostname, have no systemd (jobs run under the plain supervisor), and "
    "`xce lab down` does not stop jobs they started. With root, `xce lab up` gives each host its own "
    "namespaces."
)


class LabError(XceError):
    """The practice cluster could not be started or stopped; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Lab:
    """What `<home>/lab.json` records: enough for `down` to undo everything `up` did."""

    dir: Path
    names: list[str]
    mode: str  # systemd, plain or unprivileged
    known_hosts: list[str]


@dataclasses.dataclass(frozen=True)
class Started:
    lab: Lab
    hosts: list[testhosts.TestHost]
    already: bool  # the lab was up before: nothing changed
    seconds: float
    notes: list[str]


@dataclasses.dataclass(frozen=True)
class HostState:
    host: testhosts.TestHost
    alive: bool
    sshd: bool  # its sshd answers
    registered: bool  # xce.yaml lists it

    @property
    def up(self) -> bool:
        return self.alive and self.sshd


def default_dir(home: Home) -> Path:
    """<home>/lab, unless the home lies where the hosts have private copies (/tmp...): then a
    directory under ~/.cache/xce-testhosts named after the home's path."""
    try:
        return testhosts._check_dir(home.root / "lab")
    except testhosts.TestHostError:
        digest = hashlib.sha256(str(home.root).encode()).hexdigest()[:12]
        return Path.home() / ".cache" / "xce-testhosts" / f"lab-{digest}"


def load(home: Home) -> Lab | None:
    """The lab recorded in the home, or None."""
    try:
        data = json.loads((home.root / STATE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise LabError(f"{home.root / STATE} is unreadable ({err}); if no lab runs, remove it") from None
    return Lab(Path(data["dir"]), data["names"], data["mode"], data["known_hosts"])


def _save(home: Home, lab: Lab) -> None:
    data = dict(dataclasses.asdict(lab), dir=str(lab.dir), version=1)
    config_edit.replace_file(home.root / STATE, json.dumps(data, indent=1) + "\n")


def up(home: Home, n: int = 2, plain: bool = False, unprivileged: bool | None = None, dir: str | None = None,
       timeout: float = 60.0) -> Started:
    """Boot lab1..labN and register them in the home (see the module docstring); `unprivileged`:
    None means so when not root. Raises LabError or ConfigError, having undone what it did."""
    home.require()
    config = load_config(home.config)  # a broken config is named before anything boots
    other = clusters.owner(config.cluster, home.root, homes_only=True)
    if other is None:
        clusters.claim(config.cluster, home.root)  # so that a later `xce init` picks another name
    elif load(home) is None:
        raise LabError(f"this home's cluster name {config.cluster!r} is also used by {other}: the hosts of two "
                       f"clusters of one name collide (one agent per ~/.xce-agent/{config.cluster}-HOST). Give this "
                       f"home another `cluster:` in {home.config} (stop its controller first), then `xce lab up` again")
    notes: list[str] = []
    shared = config.mode == "shared"
    if shared and (os.geteuid() != 0 or unprivileged):
        raise LabError("this home is shared: its practice hosts run each job as the user who submitted it, so "
                       "their agents must be root: run `sudo xce lab up` (as root, and without --unprivileged)")
    if unprivileged is None:
        unprivileged = os.geteuid() != 0
    if unprivileged and not plain:
        plain = True
        if os.geteuid() != 0:
            notes.append("Not root: hosts with systemd need root (namespaces), so these are plain hosts.")
    mode = "unprivileged" if unprivileged else "plain" if plain else "systemd"
    existing = load(home)
    if existing is not None:
        states = status(home)
        if states and all(s.up for s in states):
            if len(states) == n and existing.mode == mode:
                return Started(existing, [s.host for s in states], True, 0.0, [])
            raise LabError(f"a lab of {len(states)} {existing.mode} host(s) is up in {existing.dir}; stop it with "
                           f"`xce lab down` to start another")
        down(home)
        notes.append(f"An earlier lab in {existing.dir} was no longer up; cleaned up what it left.")
        config = load_config(home.config)
    names = [f"{NAME_PREFIX}{i}" for i in range(1, n + 1)]
    clash = sorted({h.name for h in config.hosts} & set(names))
    if clash:
        raise ConfigError(f"{home.config} already has host(s) {', '.join(clash)}, which are not the lab's: the "
                          f"lab's hosts are named {NAME_PREFIX}1..{NAME_PREFIX}{n}; rename those first")
    try:
        lab_dir = testhosts._check_dir(dir) if dir else default_dir(home)
    except testhosts.TestHostError as err:
        raise LabError(str(err)) from None
    lab = Lab(lab_dir, names, mode, [])
    _save(home, lab)  # intent first: from here on `down` can undo whatever happens
    t0 = time.monotonic()
    keys_added = False
    try:
        hosts = testhosts.up(n, lab_dir, plain=plain, unprivileged=unprivileged, prefix=NAME_PREFIX, timeout=timeout)
        lab = dataclasses.replace(lab, known_hosts=[_known_hosts_line(h) for h in hosts])
        _save(home, lab)
        if shared:
            _open_for_users(lab_dir)
        config_edit.add_known_hosts(home.known_hosts, lab.known_hosts, replace=True)
        keys_added = True
        entries = [_entry(h, mode, f"{lab_dir / AGENTS}/{config.cluster}-{h.name}" if shared else None) for h in hosts]
        config_edit.add_hosts(home.config, entries, comment=COMMENT)
    except BaseException as err:
        left = _undo(home, lab, keys_added)
        if left:
            raise LabError(f"the lab did not start ({err}), and undoing it failed: {'; '.join(left)}; "
                           f"fix that, then run `xce lab down`") from err
        if isinstance(err, testhosts.TestHostError):
            raise LabError(f"the lab did not start: {err}") from None
        raise
    if unprivileged:
        notes.append(UNPRIVILEGED_NOTE)
    return Started(lab, hosts, False, time.monotonic() - t0, notes)


def _known_hosts_line(host: testhosts.TestHost) -> str:
    key_type, key = host.host_key_path.read_text().split()[:2]
    return config_edit.known_hosts_line(host.ip, host.port, key_type, key)


def _entry(host: testhosts.TestHost, mode: str, spool: str | None = None) -> dict:
    entry = {"name": host.name, "type": "ssh", "address": host.ip, "port": host.port, "user": host.user,
             "identity": str(host.key_path), "launch": "systemd" if mode == "systemd" else "plain",
             "slots": SLOTS, "mem": MEM, "tags": [LAB_TAG]}
    return {**entry, "spool": spool} if spool else entry


def _open_for_users(lab_dir: Path) -> None:
    """A shared lab's directory and its agents' parent: 0711, so users pass through to their own job
    directories (each agent opens its spool to pass-through when it first runs a job as another
    user); the keys in it stay 0600, root's."""
    (lab_dir / AGENTS).mkdir(mode=0o711, exist_ok=True)
    for path in (lab_dir, lab_dir / AGENTS):
        os.chmod(path, 0o711)


def _undo(home: Home, lab: Lab, keys_added: bool) -> list[str]:
    """Take back a failed `up` (xce.yaml was not written: adding the hosts is its last step, and one
    atomic edit): the known_hosts lines, the hosts, then the record, which stays if anything else
    could not be undone, for `xce lab down`. Returns what could not be undone."""
    left = []
    try:
        if keys_added:
            config_edit.remove_known_hosts(home.known_hosts, lab.known_hosts)
    except XceError as err:
        left.append(str(err))
    try:
        testhosts.down(lab.dir)
    except (testhosts.TestHostError, OSError) as err:
        left.append(f"stopping the hosts in {lab.dir}: {err}")
    if not left:
        (home.root / STATE).unlink(missing_ok=True)
    return left


def down(home: Home) -> tuple[Lab, list[str]] | None:
    """Stop the lab and remove its entries; the lab and the host names removed from xce.yaml, or
    None when no lab is recorded. If xce.yaml cannot be edited, the lab stays up (ConfigError says why)."""
    home.require()
    lab = load(home)
    if lab is None:
        return None
    config = load_config(home.config)
    ours = [h for h in config.hosts if h.name in lab.names and h.type == "ssh" and LAB_TAG in h.tags]
    try:
        removed = config_edit.remove_hosts(home.config, [h.name for h in ours])
    except ConfigError as err:
        raise ConfigError(f"{err}\nthe lab is still up; fix that, then run `xce lab down` again") from None
    config_edit.remove_known_hosts(home.known_hosts, lab.known_hosts)
    try:
        testhosts.down(lab.dir)
    except testhosts.TestHostError as err:
        raise LabError(f"stopping the lab's hosts in {lab.dir} failed: {err}") from None
    _remove_agent_dirs([_on_this_machine(h.agent_spool(config.cluster), h.user) for h in ours], lab.dir)
    (home.root / STATE).unlink(missing_ok=True)
    return lab, removed


def _on_this_machine(path: str, user: str | None) -> Path:
    """A lab host's `~/...` path here: its `~` is the home of the user the host logs in."""
    return clusters.user_home(user) / path[2:] if path.startswith("~/") else Path(path)


def _remove_agent_dirs(dirs: list[Path], lab_dir: Path) -> None:
    """What the hosts' agents kept (journal, bin/) in `~/.xce-agent/CLUSTER-labN` (a shared lab's: in
    <lab dir>/agents): the lab hosts share this machine's file system, so their directories are here,
    and nothing of them outlives `down`. Only a directory named for this cluster's lab host is removed
    (never a spool someone moved elsewhere)."""
    for folder in dirs:
        ours = folder.parent.name == ".xce-agent" or folder.parent == lab_dir / AGENTS
        if ours and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)
    try:
        (lab_dir / AGENTS).rmdir()
    except OSError:
        pass  # not a shared lab's, or something else is in it


def status(home: Home) -> list[HostState] | None:
    """Each lab host: alive, sshd answering, registered in xce.yaml; None when no lab is recorded."""
    lab = load(home)
    if lab is None:
        return None
    try:
        registered = {h.name for h in load_config(home.config).hosts}
    except ConfigError:
        registered = set()  # status still tells what runs; `xce lab down` will name the config's problem
    return [HostState(s.host, s.alive, s.sshd, s.host.name in registered) for s in testhosts.status(lab.dir)]


# ---- what the commands print ------------------------------------------------------------------------


def up_report(home: Home, started: Started, controller_running: bool) -> str:
    """What `xce lab up` tells the user: what was made, where, and what to do next."""
    lab, hosts = started.lab, started.hosts
    lines = [f"The lab is already up: {len(hosts)} {lab.mode} host(s) in {lab.dir}." if started.already else
             f"Started {len(hosts)} {lab.mode} practice host(s) in {lab.dir} ({started.seconds:.1f} s):"]
    lines += [f"  {h.name}  {h.user}@{h.ip}:{h.port}  {h.mode}  pid {h.pid}" for h in hosts]
    if started.already:
        lines.append("`xce lab status` shows them; `xce lab down` stops them.")
        return "\n".join(lines)
    lines += [
        f"Registered in {home.config} as ssh hosts {', '.join(h.name for h in hosts)} (tags: [{LAB_TAG}]; {SLOTS} "
        f"slots and {MEM} each: they share this machine), their host keys in {home.known_hosts}.",
        *started.notes,
        f"Try: ssh -F {lab.dir / 'ssh_config'} {hosts[0].name} hostname",
        "Next: " + ("nothing to do: the controller is connecting to them now (it has read xce.yaml again)"
                    if controller_running else "start the controller: `xce controller start`"),
        f"  then `xce hosts` and `xce submit -R \"select[{LAB_TAG}]\" -n {2 * len(hosts)} -- hostname`.",
        "Stop with: xce lab down",
    ]
    return "\n".join(lines)


def status_lines(states: list[HostState]) -> list[str]:
    """One line per lab host: name, address, kind, pid, whether it is up and registered."""
    rows = []
    for s in states:
        state = "up" if s.up else "no-sshd" if s.alive else "down"
        h = s.host
        rows.append(f"{h.name}  {h.ip}:{h.port}  {h.mode}  pid {h.pid}  {state}"
                    f"{'' if s.registered else '  (not in xce.yaml)'}")
    return rows
