"""Jobs run as their submitter (issue 16, the host side): a launch spec's `user` runs the job, its
tasks and its hooks (but an `as: root` hook) as that user, with their HOME, USER and LOGNAME, its
output files and XCE_JOB_HOST_DIR theirs; the spool stays root's and private. On this machine (a
plain agent, as root), a plain test host and a systemd test host (system units), each driven
directly through AgentOps, as the controller does.

Real users and a group are made here (useradd) and removed after; the test hosts share this
machine's /etc/passwd and file system. Work directories live under /var/lib/xce-tests (0711, removed
after), which the users can reach and the hosts see: the usual test directory lies under /root, out
of their reach, and each host has its own /tmp and /var/tmp.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.agent_hosts import PY, HostAgent, name
from tests.support.agent_hosts import request as unit_request
from tests.support.agent_local import AGENT
from tests.support.localusers import shared_dir
from tests.support.waiting import wait_until
from xce_lite.exec.host import HookRun, JobUser, LaunchRequested, Task, TaskFinished

# a held job's loop gives up by itself after a minute: a failed test leaves no job of its users running
BOUNDED = "i=0; while [ $((i += 1)) -lt 600 ] &&"
SECRET = "xce-runas-secret-" + uuid.uuid4().hex  # in one user's job env: no other user may read it


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=60)


@pytest.fixture(scope="module")
def users():
    """Two local users (alice-like U in a supplementary group, and V), removed after:
    {"u": pwd entry, "v": pwd entry, "group": (name, gid)}."""
    tag = f"{os.getpid() % 100000}"
    u, v, group = f"xceru{tag}", f"xcerv{tag}", f"xcerg{tag}"
    for who in (u, v):
        run("userdel", who)  # leftovers of a killed run
    run("groupdel", group)
    subprocess.run(["groupadd", "--system", group], check=True, capture_output=True)
    try:
        for who, extra in ((u, ["-G", group]), (v, [])):
            subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--home-dir",
                            f"/nonexistent/{who}", "--shell", "/usr/sbin/nologin", *extra, who],
                           check=True, capture_output=True)
        import grp

        yield {"u": pwd.getpwnam(u), "v": pwd.getpwnam(v), "group": (group, grp.getgrnam(group).gr_gid)}
    finally:
        for who in (u, v):
            run("userdel", who)
        run("groupdel", group)


@pytest.fixture
def base():
    """A directory the users can pass through (0711) that the hosts share with this machine."""
    with shared_dir("runas-") as path:
        yield path


def home_of(base: Path, entry) -> Path:
    """`entry`'s own work directory under `base` (0700, theirs): cwd and outputs of their jobs."""
    path = base / entry.pw_name
    path.mkdir()
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o700)
    return path


def as_user(entry) -> JobUser:
    return JobUser(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)


def start_agent(request, kind: str, base: Path) -> HostAgent:
    """An agent serving `base`/spool as root: on this machine (plain), or on a test host over ssh."""
    spool = str(base / "spool")
    if kind == "local":
        argv, host = [PY, "-S", "-E", str(AGENT), "serve", "--spool", spool, "--mode", "plain",
                      "--host-name", "here"], "here"
    else:
        hosts = request.getfixturevalue("systemd_hosts" if kind == "systemd" else "plain_hosts")
        host = hosts[0].name
        argv = hosts[0].ssh_argv([PY, "-S", "-E", str(AGENT), "serve", "--spool", spool, "--mode", kind,
                                  "--host-name", host])
    return HostAgent(host, argv, base / "agent.log")


@pytest.fixture(params=["local", "plain", "systemd"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def agent(request, kind, base):
    started = start_agent(request, kind, base)
    yield started
    started.close()
    assert "Traceback" not in (base / "agent.log").read_text(), "the agent failed: see its log"


def read_as(entry, path: Path | str) -> subprocess.CompletedProcess:
    """`cat path` (or `ls` for a directory) as `entry`, with their own groups only."""
    what = "ls" if os.path.isdir(path) else "cat"
    return run("setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", what, str(path))


JOB = ('id -un; id -Gn; echo "home=$HOME user=$USER logname=$LOGNAME"; '
       'stat -c "dir=%U %a" "$XCE_JOB_HOST_DIR"; stat -c "hostfile=%U" "$XCE_HOSTFILE"; '
       'echo scratch > "$XCE_JOB_HOST_DIR/scratch" && stat -c "scratch=%U" "$XCE_JOB_HOST_DIR/scratch"')


def test_a_job_its_hooks_and_its_files_are_its_users_and_a_root_hook_runs_as_root(agent, base, users):
    u = users["u"]
    work = home_of(base, u)
    log = work / "hooks.log"
    hooks = (
        HookRun("pre_job_exec", "profile", ("/bin/sh", "-c", f'echo "pre $(id -un) $HOME" >> {log}'), 20),
        HookRun("post_job_exec", "job", ("/bin/sh", "-c", f'echo "post $(id -un) $USER" >> {log}'), 20),
        HookRun("post_host_exec", "profile", ("/bin/sh", "-c", f'echo "root $(id -un)" >> {log}'), 20, as_root=True),
    )
    # without hooks, a systemd host runs the job as its unit's main process (User=); with, the
    # supervisor drops to the user for each process of the job
    for with_hooks in (False, True):
        unit = name("as-user")
        # a submitted env that names another HOME and USER: the passwd entry's win
        env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "USER": "root", "LOGNAME": "root"}
        [reply] = agent.launch([unit_request(unit, ["/bin/sh", "-c", JOB], work, user=as_user(u), env=env,
                                        hooks=hooks if with_hooks else (), hostfile="h1 1\n",
                                        stderr=str(work / f"{unit}.err"))])
        assert reply.status == "started", reply
        result = agent.finished(unit)
        assert (result.exit_code, result.reason) == (0, None), (work / f"{unit}.out").read_text()
        lines = (work / f"{unit}.out").read_text().splitlines()
        body = [line for line in lines if not line.startswith("[xce]")]
        assert body[0] == u.pw_name
        assert users["group"][0] in body[1].split()
        assert body[2] == f"home={u.pw_dir} user={u.pw_name} logname={u.pw_name}"
        assert body[3] == f"dir={u.pw_name} 700"
        assert body[4:] == [f"hostfile={u.pw_name}", f"scratch={u.pw_name}"]
        for out in (work / f"{unit}.out", work / f"{unit}.err"):
            assert out.stat().st_uid == u.pw_uid
    assert log.read_text().splitlines() == [f"pre {u.pw_name} {u.pw_dir}", f"post {u.pw_name} {u.pw_name}",
                                            "root root"]
    assert not (base / "spool" / "units" / unit).exists(), "the unit's directory outlived it"
    assert oct(stat.S_IMODE((base / "spool").stat().st_mode)) == "0o711"  # others pass, list nothing


def test_a_users_job_and_tasks_across_an_agent_restart_then_a_kill(request, kind, agent, base, users):
    """Faults in sequence: a user's held job runs a task of `xce launch` (as the user), its agent
    goes away and a new one serves the spool (which stays open to the user's job: 0711), the job
    still reaches its directory, then a kill ends it with its reason and its directory goes."""
    u = users["u"]
    work = home_of(base, u)
    release, unit = work / "release", name("held")
    hold = ["/bin/sh", "-c", f'{BOUNDED} [ ! -e {release} ]; do echo tick > "$XCE_JOB_HOST_DIR/alive"; sleep 0.1; done']
    [reply] = agent.launch([unit_request(unit, hold, work, user=as_user(u))])
    assert reply.status == "started", reply
    job_dir = base / "spool" / "units" / unit / "job"
    wait_until(lambda: (job_dir / "alive").exists(), 30, "the held job to write in its directory")
    agent.tasks(unit, f"{unit}.t1", [Task(0, ("/bin/sh", "-c", 'id -un > "$XCE_JOB_HOST_DIR/task"'),
                                          {"PATH": "/usr/bin:/bin"}, str(work))])
    done = agent.event(lambda e: isinstance(e, TaskFinished) and e.unit == unit, "the task to end")
    assert (done.exit_code, done.error) == (0, None), done
    assert (job_dir / "task").read_text() == f"{u.pw_name}\n" and (job_dir / "task").stat().st_uid == u.pw_uid
    agent.close()  # no lease: the agent exits, the job runs on
    again = start_agent(request, kind, base)
    try:
        assert [x.status for x in again.list_units() if x.unit == unit] == ["running"]
        assert oct(stat.S_IMODE((base / "spool").stat().st_mode)) == "0o711"
        if kind == "systemd":  # systemd re-reads its transient units: the privileged stop script must survive it
            host = request.getfixturevalue("systemd_hosts")[0]
            subprocess.run(host.nsenter_argv(["systemctl", "daemon-reload"]), check=True, timeout=60)
        (job_dir / "alive").unlink()
        wait_until(lambda: (job_dir / "alive").exists(), 30, "the job to write in its directory again")
        assert again.signal(unit, "TERM", "killed by root")
        result = again.finished(unit)
        assert result.reason == "killed by root", result
        wait_until(lambda: not (base / "spool" / "units" / unit).exists(), 30, "the unit's directory to go")
    finally:
        again.close()


def test_a_user_reads_nothing_of_another_users_job_in_the_spool(agent, base, users):
    """V's job runs (held) with SECRET in its env and a hostfile; U can list no spool directory
    and read no file of the spool that holds SECRET, nor V's job directory, while U's own job
    reaches its own directory."""
    u, v = users["u"], users["v"]
    vwork, uwork = home_of(base, v), home_of(base, u)
    release = vwork / "release"
    vunit, uunit = name("v-held"), name("u-peek")
    hold = ["/bin/sh", "-c", f'echo up > {vwork}/up; {BOUNDED} [ ! -e {release} ]; do sleep 0.1; done']
    # a hook makes it a supervised unit under systemd: its spec.json (the env) is in the spool then
    hooks = (HookRun("post_job_exec", "job", ("/bin/true",), 20),)
    env = {"PATH": "/usr/bin:/bin", "S": SECRET}
    [reply] = agent.launch([unit_request(vunit, hold, vwork, user=as_user(v), env=env, hostfile="secret-host 1\n",
                                         hooks=hooks)])
    assert reply.status == "started", reply
    wait_until(lambda: (vwork / "up").exists(), 30, "V's job to run")
    spool = base / "spool"
    vdir = spool / "units" / vunit
    seen = []
    for root, dirs, files in os.walk(spool):
        for entry in [*dirs, *files]:
            path = Path(root) / entry
            if path.is_socket():
                continue
            done = read_as(u, path)
            if path.is_dir():
                assert done.returncode != 0, f"U lists {path}: {done.stdout!r}"
            elif done.returncode == 0:
                assert SECRET not in done.stdout and "secret-host" not in done.stdout, f"U reads {path}"
            seen.append(path)
    assert vdir / "job" / "hostfile" in seen
    assert read_as(u, spool / "journal").returncode != 0
    assert read_as(v, vdir / "job" / "hostfile").stdout == "secret-host 1\n"  # V's own, theirs to read
    # U's own job, meanwhile, tries the same from inside
    peek = f'ls {spool}; ls {spool}/units; cat {spool}/journal; ls {vdir}; cat {vdir}/job/hostfile; echo "own:"; ' \
           'ls "$XCE_JOB_HOST_DIR"'
    [reply] = agent.launch([unit_request(uunit, ["/bin/sh", "-c", peek], uwork, user=as_user(u), hostfile="mine 1\n")])
    assert reply.status == "started", reply
    agent.finished(uunit)
    out = (uwork / f"{uunit}.out").read_text()
    assert SECRET not in out and "secret-host" not in out
    assert out.count("Permission denied") == 5, out
    assert out.endswith("own:\nhostfile\n"), out
    release.touch()
    result = agent.finished(vunit)
    assert (result.exit_code, result.reason) == (0, None)


def test_a_user_who_cannot_be_switched_to_is_refused_naming_host_and_user(agent, base, users):
    u = users["u"]
    work = home_of(base, u)
    cases = {
        "nosuchxceuser": JobUser(name="nosuchxceuser", uid=54321),
        "uid": JobUser(name=u.pw_name, uid=u.pw_uid + 1),
    }
    for what, user in cases.items():
        [reply] = agent.launch([unit_request(name("refused"), ["/bin/true"], work, user=user)])
        assert reply.status == "refused", reply
        assert f"host {agent.name}" in reply.error and user.name in reply.error, reply.error
        if what == "uid":
            assert f"uid {u.pw_uid} here but {u.pw_uid + 1}" in reply.error
    assert agent.probe().extra["can_switch_user"] is True


def test_xce_launch_from_a_users_job_and_another_user_refused(agent, base, users):
    """`xce launch` from a job run as U: its tasks run as U. V's job, which names U's unit, is
    refused: the agent knows who calls (SO_PEERCRED) and whom each unit runs as."""
    u, v = users["u"], users["v"]
    uwork, vwork = home_of(base, u), home_of(base, v)
    uunit, vunit = name("u-launch"), name("v-intrude")
    [reply] = agent.launch([unit_request(uunit, ["/bin/sh", "-c", 'xce launch -- id -un; echo "launch exited $?"'],
                                         uwork, user=as_user(u))])
    assert reply.status == "started", reply
    asked = agent.event(lambda e: isinstance(e, LaunchRequested) and e.unit == uunit, "U's launch request")
    intrude = f'XCE_UNIT={uunit} xce launch -- id -un; echo "intruder exited $?"'
    [reply] = agent.launch([unit_request(vunit, ["/bin/sh", "-c", intrude], vwork, user=as_user(v))])
    assert reply.status == "started", reply
    assert agent.finished(vunit).exit_code == 0
    out = (vwork / f"{vunit}.out").read_text()
    assert f"unit {uunit} is not a job of yours" in out and out.endswith("intruder exited 255\n"), out
    assert not any(isinstance(e, LaunchRequested) and e.unit == uunit and e is not asked for e in agent.seen)
    agent.tasks(uunit, asked.launch_id, [Task(0, asked.argv, asked.env, asked.cwd)])
    done = agent.event(lambda e: isinstance(e, TaskFinished) and e.unit == uunit, "U's task to end")
    assert (done.exit_code, done.error) == (0, None), done
    assert agent.launch_done(asked.launch_id, 0)
    assert agent.finished(uunit).exit_code == 0
    assert (uwork / f"{uunit}.out").read_text() == f"{u.pw_name}\nlaunch exited 0\n"


def test_a_job_a_user_cannot_start_ends_with_why(agent, base, users):
    """The user's permissions, not root's: an output file in a directory only root may write,
    a program they may not execute, a cwd they may not enter."""
    u, v = users["u"], users["v"]
    work, other = home_of(base, u), home_of(base, v)
    unit = name("no-out")
    [reply] = agent.launch([unit_request(unit, ["/bin/true"], work, user=as_user(u), stdout=str(other / "x.out"))])
    assert reply.status in ("started", "finished"), reply
    reason = agent.finished(unit).reason
    assert "cannot open output file" in reason and "Permission denied" in reason, reason
    assert not (other / "x.out").exists()
    unit = name("no-cwd")
    [reply] = agent.launch([unit_request(unit, ["/bin/true"], other, user=as_user(u), stdout=str(work / "y.out"))])
    result = agent.finished(unit)
    assert result.exit_code is None and result.reason == f"cannot change directory to {other} as user {u.pw_name}: " \
        "Permission denied", result


def test_an_agent_that_is_not_root_says_so_and_refuses_other_users(base, users):
    """On this machine: an agent run as U runs U's own jobs as before, and refuses V's. It is
    started from a directory U cannot enter (as from root's 0700 checkout): its supervisors must
    not need the agent's starting directory."""
    u, v = users["u"], users["v"]
    work = home_of(base, u)
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    agent_copy = work / "agent.py"
    shutil.copy(AGENT, agent_copy)
    os.chown(agent_copy, u.pw_uid, u.pw_gid)
    argv = ["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--init-groups", "env", "-i",
            "PATH=/usr/bin:/bin", PY, "-S", "-E", str(agent_copy), "serve", "--spool",
            str(work / "spool"), "--mode", "plain", "--host-name", "mine"]
    agent = HostAgent("mine", argv, work / "agent.log", cwd=closed)
    try:
        facts = agent.probe().extra
        assert facts["can_switch_user"] is False and "not root" in facts["can_switch_user_why"]
        [reply] = agent.launch([unit_request(name("v"), ["/bin/true"], work, user=as_user(v))])
        assert reply.status == "refused" and "host mine" in reply.error and v.pw_name in reply.error, reply
        assert "not root" in reply.error
        unit = name("self")
        [reply] = agent.launch([unit_request(unit, ["/bin/sh", "-c", "id -un"], work, user=as_user(u))])
        assert reply.status == "started", reply
        assert agent.finished(unit).exit_code == 0
        assert (work / f"{unit}.out").read_text() == f"{u.pw_name}\n"
    finally:
        agent.close()


def test_hosts_l_says_when_a_host_cannot_run_jobs_as_other_users():
    from xce_lite.cli.hosts import agent_line

    agent = {"mode": "plain", "version": 3, "hostname": "h", "cpus": 2, "mem": 1 << 30, "can_switch_user": False,
             "can_switch_user_why": "the agent runs as uid 1000, not root"}
    assert "jobs run only as the agent's user: the agent runs as uid 1000, not root" in agent_line(agent)
    assert "only as the agent's user" not in agent_line({**agent, "can_switch_user": True})
    assert "only as the agent's user" not in agent_line({k: v for k, v in agent.items() if k != "can_switch_user"})
