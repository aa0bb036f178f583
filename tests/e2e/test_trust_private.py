"""Private by default (issue 13, item 5), with the real controller and real hosts of every kind.

A cluster home is 0700 whatever $HOME's mode, and every file the controller or an agent writes is
0600 (directories 0700): the store, its WAL and SHM files, the logs, the spools with their journals,
specs, env files and results, on the local host, an ssh host with systemd and a plain ssh host. A
job's environment never reaches a systemd unit's properties (`systemctl show -p Environment`) nor a
command line; a job's own output files follow the umask of whoever submitted it, as in LSF.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, hosts_ok
from tests.support.remote import close
from tests.support.waiting import wait_until
from xce_lite.exec import bundle

KINDS = ("local", "systemd", "plain")


@contextlib.contextmanager
def umask(mask: int):
    """Run what is inside with this umask: `xce submit` (a child process) records it for its job."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def open_to_others(*roots: Path) -> list[str]:
    """Every path under `roots` (the roots included) with a group or other permission bit, with its
    mode; the job's own output files are not there (they follow the submitter's umask)."""
    found = []
    for root in roots:
        for path in [root, *sorted(root.rglob("*"))]:
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:
                continue  # a unit's directory, removed as we walked
            if stat.S_ISLNK(mode):
                continue
            if mode & 0o077:
                found.append(f"{path} {stat.filemode(mode)}")
    return found


def file_mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def cmdlines_holding(secret: str) -> list[str]:
    """Command lines of this machine's processes (test hosts' included: we see their PID namespaces)
    that hold `secret`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                data = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if secret.encode() in data:
                words = data.replace(bytes(1), b" ").decode(errors="replace")
                found.append(f"{entry.name}: {words}")
    return found


@pytest.fixture
def three_kinds(systemd_hosts, plain_hosts, testhosts_root):
    """A cluster of the local host, a systemd ssh host and a plain ssh host, each in a queue of its
    own; the ssh hosts' spools are in this test's directory, to walk them."""
    root = testhosts_root / f"private-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    sysd, plain = systemd_hosts[0], plain_hosts[0]
    known = sorted({str(h.known_hosts_path) for h in (sysd, plain)})
    hosts = "".join(
        f"  - {{name: {name}, type: ssh, address: '{h.ip}', user: root, identity: '{h.key_path}', slots: 4, "
        f"mem: 1G, spool: '{root}/spool-{name}'}}\n" for name, h in (("sysd", sysd), ("plain", plain)))
    config = (f"cluster: pv{os.getpid()}\nhosts:\n  - {{name: local, slots: 4, mem: 1G}}\n{hosts}"
              f"queues:\n  - {{name: normal, default: true, hosts: [local]}}\n"
              f"  - {{name: systemd, hosts: [sysd]}}\n  - {{name: plain, hosts: [plain]}}\n"
              f"ssh:\n  config: /nonexistent\n  known_hosts: {json.dumps(known)}\n  reconnect_max: 2s\n"
              f"controller:\n  tick: 1s\n  grace: 1s\n")
    c = Cluster(config=config, work=root / "work")
    os.chmod(c.home / "xce.yaml", 0o600)  # the harness wrote it as a user would; `xce init` makes it 0600
    c.start()
    c.name = f"pv{os.getpid()}"
    c.spools = {"local": c.home / "spool", "systemd": root / "spool-sysd", "plain": root / "spool-plain"}
    c.sysd = sysd
    try:
        hosts_ok(c, "the three hosts up")
        yield c
    finally:
        close(c)


def test_every_file_is_private_and_no_job_env_is_on_a_unit_on_every_host_kind(three_kinds: Cluster):
    c, secret = three_kinds, f"s3cret-{uuid.uuid4().hex}"
    queue = {"local": "normal", "systemd": "systemd", "plain": "plain"}
    running, done = {}, {}
    for kind in KINDS:
        wait = (f"touch {c.work}/{kind}.running {c.work}/{kind}-$XCE_JOBID.made; "
                f"while [ ! -e {c.work}/{kind}.go ]; do sleep 0.1; done")
        base = ("-q", queue[kind], "--env", f"XCE_TEST_SECRET={secret}")
        with umask(0o027):  # the job's own files: 0640
            running[kind] = c.submit("sh", "-c", wait, options=(*base, "-o", f"{c.work}/{kind}-run.out"))
            # a pre-exec hook puts a systemd job under the supervisor (spec.json holds its env)
            running[f"{kind}-hooked"] = c.submit("sh", "-c", wait, options=(
                *base, "-E", "true", "-o", f"{c.work}/{kind}-hooked.out"))
        with umask(0o022):
            done[kind] = c.submit("sh", "-c", "echo out; echo err >&2", options=(
                *base, "-o", f"{c.work}/{kind}-done.out", "-e", f"{c.work}/{kind}-done.err"))
    for job_id in done.values():
        assert c.wait_state(job_id, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
    wait_until(lambda: all(c.job(i)["state"] == "RUN" for i in running.values()), 60, "the holding jobs running")
    wait_until(lambda: all((c.work / f"{k}.running").exists() for k in KINDS), 30, "the holding jobs started")

    # while they run: their host directories (env files, specs, hostfiles) are there too
    assert file_mode(c.home) == 0o700  # the harness made it 0755, as `mkdir` under a 0755 $HOME would
    private = [c.home, c.spools["systemd"], c.spools["plain"]]
    copy = Path(os.path.expanduser("~/.xce-agent")) / bundle.agent_copy()[1]  # the ssh hosts' agent copy
    assert open_to_others(*private, copy) == [], "open to other users while jobs run"
    assert list(c.spools["systemd"].glob("units/*/job-env.sh")) and list(c.spools["systemd"].glob("units/*/spec.json"))
    for name in (running["systemd"], running["systemd-hooked"]):
        unit = f"xce-{c.name}-{name}-1-0.service"
        argv = ["systemctl", "show", "-p", "Environment", "-p", "ActiveState", unit]
        show = subprocess.run(c.sysd.nsenter_argv(argv), capture_output=True, text=True, timeout=30, check=True).stdout
        assert "ActiveState=active" in show and secret not in show and "XCE_" not in show, show
        unit_file = subprocess.run(c.sysd.nsenter_argv(["cat", f"/run/systemd/transient/{unit}"]),
                                   capture_output=True, text=True, timeout=30, check=True).stdout
        assert secret not in unit_file and "Environment" not in unit_file, unit_file
    assert cmdlines_holding(secret) == []

    c.kill9_controller()  # a restart in the middle: new agents, new logs, the same store
    c.start()
    hosts_ok(c, "the three hosts back")
    assert open_to_others(*private, copy) == [], "open to other users after a restart"
    for kind in KINDS:
        (c.work / f"{kind}.go").touch()
    for job_id in running.values():
        assert c.wait_state(job_id, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
    assert open_to_others(*private, copy) == [], "open to other users after the jobs ended"
    assert (c.home / "xce.db-wal").exists() and (c.home / "controller.log").exists()

    # the jobs' own output files follow their submitter's umask, hooks' output included
    for kind in KINDS:
        got = {name: oct(file_mode(c.work / name)) for name in (f"{kind}-run.out", f"{kind}-hooked.out",
                                                                f"{kind}-done.out", f"{kind}-done.err")}
        assert got == {f"{kind}-run.out": "0o640", f"{kind}-hooked.out": "0o640", f"{kind}-done.out": "0o644",
                       f"{kind}-done.err": "0o644"}, kind
        assert (c.work / f"{kind}-done.out").read_text() == "out\n"
        made = {oct(file_mode(c.work / f"{kind}-{running[key]}.made")) for key in (kind, f"{kind}-hooked")}
        assert made == {"0o640"}, kind  # what the job makes itself: its processes have the umask too
        assert "[xce] pre_job_exec hook (job)" in (c.work / f"{kind}-hooked.out").read_text()


@pytest.fixture
def stranger():
    """A local user made for this test (removed after): (name, uid, gid)."""
    name = f"xcepv{os.getpid() % 100000}"
    subprocess.run(["userdel", name], capture_output=True)  # a leftover of a killed run
    subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        entry = pwd.getpwnam(name)
        yield name, entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def read_as(user: tuple[str, int, int], path: Path) -> subprocess.CompletedProcess:
    _name, uid, gid = user
    done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "cat", str(path)],
                          capture_output=True, timeout=30)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, done.stderr.decode(errors="replace"))


def test_another_user_reads_neither_the_store_nor_the_log_nor_the_spool_nor_a_private_output(stranger):
    c = Cluster()
    try:
        os.chmod(c.root, 0o755)  # as a $HOME of 0755, the usual: the home's own mode must keep others out
        os.chmod(c.work, 0o755)
        os.chmod(c.home / "xce.yaml", 0o600)  # the harness wrote it as a user would; `xce init` makes it 0600
        c.start()
        secret = f"s3cret-{uuid.uuid4().hex}"
        with umask(0o077):
            mine = c.submit("sh", "-c", "echo mine", options=("--env", f"XCE_TEST_SECRET={secret}", "-o",
                                                               f"{c.work}/mine.out"))
        with umask(0o022):
            shared = c.submit("sh", "-c", "echo shared", options=("-o", f"{c.work}/shared.out"))
        for job_id in (mine, shared):
            assert c.wait_state(job_id, {"DONE", "EXIT"})["state"] == "DONE"
        c.ok("controller", "stop")  # then open it all, as an older version left a home: the next start closes it
        for path, mode in ((c.home, 0o755), (c.home / "spool", 0o755), (c.home / "xce.db", 0o644),
                           (c.home / "controller.log", 0o644), (c.home / "spool" / "local", 0o755)):
            os.chmod(path, mode)
        c.start()
        assert [oct(file_mode(p)) for p in (c.home, c.home / "xce.db", c.home / "spool" / "local")] == [
            "0o700", "0o600", "0o700"]
        assert secret.encode() in (c.home / "xce.db").read_bytes() + (c.home / "xce.db-wal").read_bytes()
        assert read_as(stranger, c.work / "shared.out").stdout == b"shared\n"  # they reach this directory
        for path in (c.home / "xce.db", c.home / "xce.db-wal", c.home / "controller.log",
                     c.home / "spool" / "local" / "journal", c.work / "mine.out"):
            assert path.exists()
            denied = read_as(stranger, path)
            assert denied.returncode != 0 and "Permission denied" in denied.stderr, f"{path}: read by another user"
        assert (c.work / "mine.out").read_text() == "mine\n" and file_mode(c.work / "mine.out") == 0o600
        assert open_to_others(c.home) == []
    finally:
        c.close()
