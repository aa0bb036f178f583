"""The practice cluster (`xce lab`) and the harness's unprivileged hosts, with real sshd and real homes.

Everything is real: `xce lab` runs as a subprocess against a real cluster home, its hosts are real sshd
(in namespaces, or run by the user), reached with OpenSSH and paramiko. The non-root case runs as a
real non-root user: one that exists only inside a private mount namespace, with its own copy of
/etc/passwd (this machine's /etc is never changed). Lab directories live under `testhosts_root`,
never under /tmp (namespaced hosts have a /tmp of their own).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.support import paths
from tests.support.cluster import Cluster
from tests.support.lab import paramiko_client, processes_referring_to, recorded_pids, run, ssh
from tests.support.waiting import wait_until
from xce_lite import testhosts
from xce_lite.config.cluster import load_config
from xce_lite.home import clusters, lab
from xce_lite.home.paths import Home

pytest_plugins = ["tests.support.testhosts_fixture"]

SOURCE_ROOT = str(paths.ROOT)
TEST_UID = 47321  # exists only in the private /etc/passwd of the non-root test


# ---- unprivileged hosts of the harness ---------------------------------------------------------------


def test_unprivileged_hosts_are_sshd_processes_reached_by_openssh_and_paramiko(testhosts_root, require_testhosts):
    require_testhosts(plain=True)
    d = testhosts_root / "unprivileged"
    try:
        hosts = testhosts.up(2, d, plain=True, unprivileged=True, die_with_caller=True)
        assert [h.mode for h in hosts] == ["unprivileged", "unprivileged"]
        assert len({h.port for h in hosts}) == 2 and all(h.ip == "127.0.0.1" and h.port > 1024 for h in hosts)
        keys = {h.host_key_path.read_text().split()[1] for h in hosts}
        assert len(keys) == 2, "each host has a host key of its own"
        machine = os.uname().nodename
        for h in hosts:  # no UTS namespace: the hostname is the machine's
            assert ssh(h, "hostname").strip() == machine
            assert testhosts._comm(h.pid) == "sshd"
        states = testhosts.status(d)
        assert [s.line() for s in states] == [f"{h.name} 127.0.0.1:{h.port} pid={h.pid} unprivileged up" for h in hosts]
        h = hosts[1]
        client = paramiko_client(h.ip, h.port, h.user, h.key_path, h.known_hosts_path)
        try:
            _, out, _ = client.exec_command("echo $$; exec sleep 300")  # a session still open at `down`
            sleeper = (int(out.readline()), None)
            wait_until(lambda: testhosts._comm(sleeper[0]) == "sleep", 10, "the session's sleep")
            sleeper = (sleeper[0], testhosts._start_time(sleeper[0]))
            sshds = recorded_pids(d)
            testhosts.down(d)
        finally:
            client.close()
        assert not [p for p, start in sshds if testhosts._alive(p, start)], "down left an sshd running"
        assert not testhosts._alive(*sleeper), "down left a session's process running"
        assert testhosts.status(d) == []
        assert not processes_referring_to(d)
    finally:
        testhosts.down(d)


def test_unprivileged_hosts_with_systemd_are_refused_with_what_to_do(testhosts_root):
    with pytest.raises(testhosts.TestHostError, match=r"need root .*plain"):
        testhosts.up(1, testhosts_root / "never", plain=False, unprivileged=True)
    assert not (testhosts_root / "never").exists()


# ---- a real non-root user ---------------------------------------------------------------------------


def as_test_user(user_dir: Path, argv: list[str], env: dict[str, str], timeout: float = 120
                 ) -> subprocess.CompletedProcess:
    """Run `argv` as uid TEST_UID, a user that exists only in a private mount namespace whose
    /etc/passwd and /etc/group are copies with that user added. Processes it leaves (the sshd of
    its hosts) stay in that namespace.

    The caller's home may be closed to others (/root is 0700): then, in the namespace only, a tmpfs
    covers it and the directories the user needs (Python, this source tree, `user_dir`) are bound
    back at their own paths, so both sides see the same paths.
    """
    home = Path.home()
    needed = {sys.prefix, sys.base_prefix, SOURCE_ROOT, str(user_dir)}
    hidden = sorted(p for p in needed if not home.stat().st_mode & 0o001 and Path(p).is_relative_to(home))
    q = shlex.quote
    lines = ["set -e", "mount -t tmpfs -o mode=755 tmpfs /srv"]
    for i, p in enumerate(hidden):
        lines += [f"mkdir /srv/{i}", f"mount --bind {q(p)} /srv/{i}"]
    if hidden:
        lines.append(f"mount -t tmpfs -o mode=755 tmpfs {q(str(home))}")
    for i, p in enumerate(hidden):
        lines += [f"mkdir -p {q(p)}", f"mount --bind /srv/{i} {q(p)}"]
    lines += [f"mount --bind {q(str(user_dir / 'passwd'))} /etc/passwd",
              f"mount --bind {q(str(user_dir / 'group'))} /etc/group",
              f"exec setpriv --reuid {TEST_UID} --regid {TEST_UID} --clear-groups env -i "
              + " ".join(q(f"{k}={v}") for k, v in env.items()) + " " + shlex.join(argv)]
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def make_test_user(user_dir: Path) -> Path:
    """The user's passwd and group copies in `user_dir`, and its home directory (returned)."""
    home = user_dir / "home"
    home.mkdir(parents=True)
    (user_dir / "passwd").write_text(Path("/etc/passwd").read_text()
                                     + f"xlab:x:{TEST_UID}:{TEST_UID}:xce lab test user:{home}:/bin/sh\n")
    (user_dir / "group").write_text(Path("/etc/group").read_text() + f"xlab:x:{TEST_UID}:\n")
    for p in (user_dir, home):
        os.chown(p, TEST_UID, TEST_UID)
    return home


def test_a_non_root_user_gets_a_working_lab_with_xce_lab_up(testhosts_root, require_testhosts):
    """The student's path: `xce init`, `xce lab up` (no --plain: not root means plain, said aloud),
    ssh to a host, `xce lab status`, `xce lab down`, all as a user with no privilege at all."""
    require_testhosts(plain=True)
    user_dir = testhosts_root / "nonroot"
    user_dir.mkdir()
    user_home = make_test_user(user_dir)
    xce_home = user_home / "xce"
    env = {"HOME": str(user_home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LANG": "C.UTF-8",
           "PYTHONPATH": SOURCE_ROOT, "XCE_HOME": str(xce_home)}
    xce = [sys.executable, "-m", "xce_lite"]
    lab_dir = xce_home / "lab"
    try:
        r = as_test_user(user_dir, [*xce, "init"], env)
        assert r.returncode == 0, r.stderr
        before = (xce_home / "xce.yaml").read_text()
        r = as_test_user(user_dir, [*xce, "lab", "up"], env)
        assert r.returncode == 0, r.stderr
        assert "Not root" in r.stdout and "share this machine's /tmp, process table and hostname" in r.stdout
        hosts = testhosts.hosts(lab_dir)
        assert [(h.name, h.user, h.mode) for h in hosts] == [("lab1", "xlab", "unprivileged"),
                                                             ("lab2", "xlab", "unprivileged")]
        for pid, _ in recorded_pids(lab_dir):
            uid = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("Uid:"))
            assert uid == str(TEST_UID), "the sshd runs as the user, not root"
        r = as_test_user(user_dir, ["ssh", "-F", str(lab_dir / "ssh_config"), "-o", "BatchMode=yes", "lab2",
                                    "id -un"], env)
        assert (r.returncode, r.stdout.strip()) == (0, "xlab"), r.stderr
        config = load_config(xce_home / "xce.yaml")
        entry = next(h for h in config.hosts if h.name == "lab1")
        assert (entry.user, entry.port, entry.launch) == ("xlab", hosts[0].port, "plain")
        client = paramiko_client(entry.address, entry.port, entry.user, Path(entry.identity), xce_home / "known_hosts")
        try:
            assert run(client, "id -u").strip() == str(TEST_UID)
        finally:
            client.close()
        r = as_test_user(user_dir, [*xce, "lab", "status"], env)
        assert r.returncode == 0 and r.stdout.count(" up") == 2, r.stdout + r.stderr
        sshds = recorded_pids(lab_dir)
        r = as_test_user(user_dir, [*xce, "lab", "down"], env)
        assert r.returncode == 0, r.stderr
        assert not [p for p, start in sshds if testhosts._alive(p, start)], "lab down left an sshd running"
        assert (xce_home / "xce.yaml").read_text() == before
        assert (xce_home / "known_hosts").read_text() == ""
    finally:
        testhosts.down(lab_dir)  # as root, by the recorded PIDs, if the test failed half-way


# ---- `xce lab` through the CLI, as root -------------------------------------------------------------


def lab_cluster() -> Cluster:
    """A home whose xce.yaml is written as a user might: comments, flow style, a known_hosts of theirs."""
    c = Cluster(config=textwrap.dedent(f"""\
        # our cluster
        cluster: t{os.getpid()}
        hosts:
          - {{name: local, slots: 2, mem: 1G}}   # this machine
        queues:
          - name: normal
            default: true
        """))
    key = base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes(range(32))).decode()
    (c.home / "known_hosts").write_text(f"gpu1.example.org ssh-ed25519 {key}\n")
    return c


@pytest.fixture
def home_with_lab_dir(testhosts_root):
    c = lab_cluster()
    lab_dir = testhosts_root / f"lab-{uuid.uuid4().hex[:8]}"
    try:
        yield c, lab_dir
    finally:
        if (c.home / lab.STATE).exists():
            c.xce("lab", "down")
        testhosts.down(lab_dir)
        c.close()


@pytest.mark.parametrize("flag", ["--plain", "--unprivileged"])
def test_lab_up_status_down_registers_and_removes_exactly_the_lab(home_with_lab_dir, require_testhosts, flag):
    require_testhosts(plain=True)
    c, lab_dir = home_with_lab_dir
    config_before = (c.home / "xce.yaml").read_text()
    known_before = (c.home / "known_hosts").read_text()

    out = c.ok("lab", "up", "2", flag, "--dir", str(lab_dir))
    assert "Started 2" in out and "xce controller start" in out and f"ssh -F {lab_dir}/ssh_config lab1" in out
    assert ("share this machine's /tmp" in out) == (flag == "--unprivileged")
    config = load_config(c.home / "xce.yaml")
    assert [h.name for h in config.hosts] == ["local", "lab1", "lab2"]
    hosts = testhosts.hosts(lab_dir)
    for entry, host in zip(config.hosts[1:], hosts):
        assert (entry.type, entry.address, entry.port, entry.user, entry.identity, entry.tags, entry.launch) == \
            ("ssh", host.ip, host.port, "root", str(lab_dir / "id_ed25519"), ["lab"], "plain")
        assert (entry.slots, entry.mem) == (lab.SLOTS, 1024**3)
    text = (c.home / "xce.yaml").read_text()
    assert text.startswith(config_before.split("queues:")[0].rstrip("\n")) and "# our cluster" in text
    known = (c.home / "known_hosts").read_text()
    assert known.startswith(known_before) and len(known.splitlines()) == 3
    # what the controller will do: reach each host with the registered fields, trusting only the home's keys
    for entry in config.hosts[1:]:
        client = paramiko_client(entry.address, entry.port, entry.user, Path(entry.identity), c.home / "known_hosts")
        try:
            assert run(client, "echo ok").strip() == "ok"
        finally:
            client.close()
    expected_name = "lab1" if flag == "--plain" else os.uname().nodename
    assert ssh(hosts[0], "hostname").strip() == expected_name

    again = c.ok("lab", "up", "2", flag, "--dir", str(lab_dir))
    assert "already up" in again and (c.home / "xce.yaml").read_text() == text
    other = c.xce("lab", "up", "3", flag)
    assert other.returncode == 1 and "xce lab down" in other.stderr

    status = c.xce("lab", "status")
    assert status.returncode == 0 and [line.split()[-1] for line in status.stdout.splitlines()] == ["up", "up"]

    pids = recorded_pids(lab_dir)
    assert "removed lab1, lab2" in c.ok("lab", "down")
    assert (c.home / "xce.yaml").read_text() == config_before
    assert (c.home / "known_hosts").read_text() == known_before
    assert not (c.home / lab.STATE).exists()
    wait_until(lambda: not any(testhosts._alive(p, s) for p, s in pids), 10, "the lab's processes to end")
    assert not processes_referring_to(lab_dir)

    assert "No lab is up" in c.ok("lab", "down")
    status = c.xce("lab", "status")
    assert status.returncode == 1 and "No lab is up" in status.stdout


def test_a_failed_up_leaves_no_process_no_config_and_no_record(home_with_lab_dir, require_testhosts):
    require_testhosts(plain=True)
    c, lab_dir = home_with_lab_dir
    (c.home / "known_hosts").unlink()
    (c.home / "known_hosts").mkdir()  # the step after the boot fails: the hosts it booted must go
    config_before = (c.home / "xce.yaml").read_bytes()
    r = c.xce("lab", "up", "2", "--plain", "--dir", str(lab_dir))
    assert r.returncode == 2 and "known_hosts" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (c.home / "xce.yaml").read_bytes() == config_before
    assert not (c.home / lab.STATE).exists() and not (lab_dir / testhosts.STATE).exists()
    assert not processes_referring_to(lab_dir)


def test_a_name_the_config_already_uses_is_refused_before_anything_starts(testhosts_root):
    c = Cluster(config="cluster: t1\nhosts: [{name: lab2, slots: 1, mem: 1G}]\nqueues: [{name: normal}]\n")
    try:
        before = (c.home / "xce.yaml").read_bytes()
        r = c.xce("lab", "up", "2", "--plain", "--dir", str(testhosts_root / "lab-clash"))
        assert r.returncode == 2 and "lab2" in r.stderr and "rename" in r.stderr
        assert (c.home / "xce.yaml").read_bytes() == before and not (testhosts_root / "lab-clash").exists()
        assert not (c.home / lab.STATE).exists()
    finally:
        c.close()


def test_a_systemd_lab_host_runs_systemd(home_with_lab_dir, require_testhosts):
    require_testhosts(plain=False)
    c, lab_dir = home_with_lab_dir
    out = c.ok("lab", "up", "1", "--dir", str(lab_dir))
    assert "1 systemd practice host" in out
    (host,) = testhosts.hosts(lab_dir)
    assert ssh(host, "systemctl is-system-running").strip() in ("running", "degraded")
    assert ssh(host, "hostname").strip() == "lab1"
    assert next(h for h in load_config(c.home / "xce.yaml").hosts if h.name == "lab1").launch == "systemd"
    c.ok("lab", "down")
    assert not processes_referring_to(lab_dir)


def test_the_lab_lives_beside_the_home_unless_the_home_is_under_tmp(tmp_path):
    assert lab.default_dir(Home(Path("/srv/cluster"))) == Path("/srv/cluster/lab")
    under_tmp = lab.default_dir(Home(Path("/tmp/x/home")))
    assert under_tmp.parent == Path.home() / ".cache" / "xce-testhosts" and under_tmp.name.startswith("lab-")
    assert under_tmp == lab.default_dir(Home(Path("/tmp/x/home"))) != lab.default_dir(Home(Path("/tmp/y")))


def test_a_running_controller_takes_the_lab_in_and_lets_it_go_live(home_with_lab_dir, require_testhosts):
    require_testhosts(plain=True)
    c, lab_dir = home_with_lab_dir
    c.start()
    out = c.ok("lab", "up", "1", "--unprivileged", "--dir", str(lab_dir))
    assert "the controller is connecting to them now" in out and "xce reconfig" not in out

    def lab1_state() -> str | None:
        listed = {h["name"]: h for h in json.loads(c.ok("hosts", "--json"))["hosts"]}
        return listed.get("lab1", {}).get("state")

    wait_until(lambda: lab1_state() == "ok", 60, "lab1 to be connected without a restart")
    job_id = c.submit("sh", "-c", "echo on-the-lab", options=("-R", "select[lab]"))
    assert c.xce("wait", str(job_id)).returncode == 0
    assert c.job(job_id)["hosts"] == [["lab1", 1]]
    assert "closed them to new work" in c.ok("lab", "down")
    assert lab1_state() is None  # out of the cluster's hosts


def test_a_second_home_gets_its_own_name_and_its_lab_works_beside_the_first(testhosts_root, require_testhosts):
    """Two homes made by `xce init` on one machine, each with a lab and a controller: different
    cluster names, both labs' hosts ok, a job on each; `down` takes each lab's agent directories."""
    require_testhosts(plain=True)
    state = testhosts_root / f"state-{uuid.uuid4().hex[:8]}"
    homes = [testhosts_root / f"home-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    carrier = Cluster()  # only for its CLI helper and its teardown of what it started
    env = dict(carrier.env, XDG_STATE_HOME=str(state))
    names = []
    try:
        for home in homes:
            said = carrier.xce("--home", str(home), "init", env=env)
            assert said.returncode == 0, said.stderr
            names.append(load_config(home / "xce.yaml").cluster)
            assert f"cluster {names[-1]}" in said.stdout
        assert names[0] != names[1] and "is taken by" in said.stdout
        for home in homes:
            for args in (("controller", "start"), ("lab", "up", "1", "--plain")):
                r = carrier.xce("--home", str(home), *args, env=env)
                assert r.returncode == 0, r.stderr
        for home in homes:
            def lab1_ok(home=home) -> bool:
                listed = json.loads(carrier.ok("--home", str(home), "hosts", "--json", env=env))["hosts"]
                return any(h["name"] == "lab1" and h["state"] == "ok" for h in listed)

            wait_until(lab1_ok, 60, f"{home}'s lab1 to be ok beside the other home's")
            job = carrier.ok("--home", str(home), "submit", "--parsable", "-R", "select[lab]", "--cwd", str(home),
                             "--", "hostname", env=env)  # a cwd outside /tmp: the hosts have their own /tmp
            assert carrier.xce("--home", str(home), "wait", job.strip(), env=env).returncode == 0
        agent_dirs = [clusters.agent_root() / f"{name}-lab1" for name in names]
        assert all(d.is_dir() for d in agent_dirs), agent_dirs
        for home in homes:
            assert "removed lab1" in carrier.ok("--home", str(home), "lab", "down", env=env)
        assert not any(d.exists() for d in agent_dirs), "lab down left an agent's directory"
    finally:
        for home in homes:
            if (home / lab.STATE).exists():
                carrier.xce("--home", str(home), "lab", "down", env=env)
            carrier.xce("--home", str(home), "controller", "stop", env=env)
        carrier.close()
