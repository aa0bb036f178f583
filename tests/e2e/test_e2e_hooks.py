"""Hooks end to end, on real systemd test hosts and real plain ones: the real controller and CLI,
application profiles with the four hooks, jobs with their own -E/-Ep, and every way a job ends.

Every hook appends a line to one log under the session's `testhosts_root` (the hosts share it):
the job id, the host, the hook's point and layer, and the job status, reason and exit code its env
says. The lines of a job, in order, prove that each hook ran once, where and when it should.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, hosts_of, hosts_ok
from tests.support.remote import close, remote_config
from tests.support.waiting import wait_until
from xce_lite import testhosts

LINE = ('printf "%s %s %s %s %s|%s|%s\\n" "$XCE_JOBID" "$(hostname)" "$XCE_HOOK" "$XCE_HOOK_LAYER" '
        '"${XCE_JOB_STATUS:--}" "$XCE_JOB_REASON" "$XCE_JOB_EXIT_CODE" >> "$HOOK_LOG"')
FIRST_HOST = ["pre_host_exec profile", "pre_job_exec profile", "pre_job_exec job",
              "post_job_exec job", "post_job_exec profile", "post_host_exec profile"]


def hook(then: str = "", timeout: str = "20s") -> dict:
    return {"argv": ["/bin/sh", "-c", LINE + (f"; {then}" if then else "")], "timeout": timeout}


def applications(log: Path) -> str:
    four = {point: hook() for point in ("pre_host_exec", "pre_job_exec", "post_job_exec", "post_host_exec")}
    profiles = {
        "hooked": {"env": {"HOOK_LOG": str(log)}, "hooks": four},
        "failpre": {"env": {"HOOK_LOG": str(log)}, "hooks": {**four, "pre_job_exec": hook("exit 3")}},
        "hungpost": {"env": {"HOOK_LOG": str(log)}, "hooks": {**four, "post_job_exec": hook("sleep 60", "2s")}},
        "nojobhooks": {"env": {"HOOK_LOG": str(log)}, "hooks": {**four, "job_hooks": False}},
        "failposthost": {"env": {"HOOK_LOG": str(log)}, "hooks": {**four, "post_host_exec": hook("exit 2")}},
    }
    return json.dumps({"applications": profiles})  # JSON is YAML


def start(hosts: list[testhosts.TestHost], root: Path) -> Cluster:
    """A cluster of its own name (so of its own agents and spools on the hosts), with the profiles."""
    name = f"hk{uuid.uuid4().hex[:6]}"
    c = Cluster(config=remote_config(hosts).replace(f"cluster: rm{os.getpid()}", f"cluster: {name}"),
                work=root / f"work-{uuid.uuid4().hex[:8]}")
    c.cluster, c.hosts = name, hosts
    (c.home / "applications.yaml").write_text(applications(c.work / "hooks.log"))
    c.start()
    hosts_ok(c, "the hosts up")
    return c


@pytest.fixture(scope="module", params=["systemd", "plain"])
def hc(request, testhosts_root):
    """A cluster of the session's systemd hosts (host1, host2) or of its plain one."""
    hosts = request.getfixturevalue("systemd_hosts" if request.param == "systemd" else "plain_hosts")
    c = start(hosts, testhosts_root)
    c.kind = request.param
    try:
        yield c
    finally:
        close(c)


def submit(c: Cluster, *command: str, app: str = "hooked", options: tuple[str, ...] = ()) -> int:
    own = ("-E", LINE, "-Ep", LINE)
    return c.submit(*command, options=("-app", app, *own, *options))


def hook_lines(c: Cluster, job_id: int) -> list[tuple[str, str, str]]:
    """(host, "point layer", "status|reason|exit code") of each hook line of the job, in order."""
    found = []
    log = c.work / "hooks.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        jobid, host, point, layer, rest = line.split(" ", 4)
        if jobid == str(job_id):
            found.append((host, f"{point} {layer}", rest))
    return found


def ended(c: Cluster, job_id: int, timeout: float = 90) -> dict:
    job = c.wait_state(job_id, {"DONE", "EXIT"}, timeout=timeout)
    return job


def assert_hooks_once_in_order(c: Cluster, job_id: int, status: str, reason: str, code: str) -> None:
    """Each of the first host's hooks ran once, in order, on the job's host; the post ones saw the end."""
    lines = hook_lines(c, job_id)
    job_host = c.job(job_id)["hosts"][0][0]
    assert [where for where, _, _ in lines] == [job_host] * 6
    assert [what for _, what, _ in lines] == FIRST_HOST
    assert [seen for _, _, seen in lines] == ["-||"] * 3 + [f"{status}|{reason}|{code}"] * 3


@pytest.mark.parametrize("code", [0, 3])
def test_hooks_run_once_in_order_around_a_job_that_exits(hc: Cluster, code: int):
    job_id = submit(hc, "sh", "-c", f"echo ran; exit {code}")
    job = ended(hc, job_id)
    assert (job["state"], job["exit_code"], job["reason"]) == (("DONE", 0, None) if code == 0 else ("EXIT", 3, None))
    assert_hooks_once_in_order(hc, job_id, job["state"], "", str(code))
    out = (hc.work / f"xce-{job_id}.out").read_text()
    assert "[xce] pre_host_exec hook (profile) on " in out and "ran\n" in out


def test_a_killed_job_runs_its_post_hooks_once(hc: Cluster):
    job_id = submit(hc, "sleep", "60")
    hc.wait_state(job_id, {"RUN"}, timeout=60)
    wait_until(lambda: len(hook_lines(hc, job_id)) == 3, 30, "the pre hooks")
    hc.ok("kill", str(job_id))
    job = ended(hc, job_id)
    reason = f"killed by {os.environ.get('USER') or 'root'}"
    assert (job["state"], job["reason"]) == ("EXIT", reason)
    assert_hooks_once_in_order(hc, job_id, "EXIT", reason, "")


def test_the_run_limit_ends_the_job_and_its_post_hooks_run_once(hc: Cluster):
    job_id = submit(hc, "sleep", "60", options=("-W", "2s"))
    job = ended(hc, job_id)
    assert (job["state"], job["reason"]) == ("EXIT", "run limit 00:00:02 reached")
    assert_hooks_once_in_order(hc, job_id, "EXIT", "run limit 00:00:02 reached", "")


def test_the_memory_limit_ends_the_job_and_its_post_hooks_run_once(hc: Cluster):
    hog = "x = bytearray(400 * 2**20); import time; time.sleep(60)"
    job_id = submit(hc, sys.executable, "-c", hog, options=("-M", "100M"))
    job = ended(hc, job_id)
    assert (job["state"], job["reason"]) == ("EXIT", "memory limit 100M exceeded")
    assert_hooks_once_in_order(hc, job_id, "EXIT", "memory limit 100M exceeded", "")


def test_a_job_whose_agent_dies_runs_its_post_hooks_once_and_its_result_arrives(hc: Cluster):
    marker = hc.work / f"go-{uuid.uuid4().hex[:6]}"
    job_id = submit(hc, "sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.1; done; exit 5")
    host = hc.wait_state(job_id, {"RUN"}, timeout=60)["hosts"][0][0]
    wait_until(lambda: len(hook_lines(hc, job_id)) == 3, 30, "the pre hooks")
    agent = hosts_of(hc)[host]["agent"]["pid"]  # as the host sees it (its own pid namespace)
    where = next(h for h in hc.hosts if h.name == host)
    subprocess.run(where.nsenter_argv(["kill", "-9", str(agent)]), check=True, timeout=30)  # the job runs on
    marker.touch()
    wait_until(lambda: len(hook_lines(hc, job_id)) == 6, 60, "the post hooks, with no agent")
    job = ended(hc, job_id)
    assert (job["state"], job["exit_code"]) == ("EXIT", 5)
    assert_hooks_once_in_order(hc, job_id, "EXIT", "", "5")


# Run inside a host: kill -9 the sshd processes of the SSH session the agent (argv[1]) hangs from,
# never the listener (the one sshd whose parent is not an sshd): the connection drops, the host
# stays reachable, and the controller reconnects to a new agent.
CUT_SESSION = """
import os, sys
def parent(pid):
    return int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("PPid:")).split()[1])
def comm(pid):
    return open(f"/proc/{pid}/comm").read().strip()
pid, session = int(sys.argv[1]), []
while pid > 1:
    pid = parent(pid)
    if comm(pid) == "sshd" and comm(parent(pid)) == "sshd":
        session.append(pid)
assert session, "the agent hangs from no sshd session"
for pid in session:
    os.kill(pid, 9)
"""


def test_a_job_whose_ssh_connection_drops_runs_its_post_hooks_once_and_its_result_arrives(hc: Cluster):
    marker = hc.work / f"go-{uuid.uuid4().hex[:6]}"
    job_id = submit(hc, "sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.1; done; exit 4")
    host = hc.wait_state(job_id, {"RUN"}, timeout=60)["hosts"][0][0]
    wait_until(lambda: len(hook_lines(hc, job_id)) == 3, 30, "the pre hooks")
    agent = hosts_of(hc)[host]["agent"]["pid"]
    where = next(h for h in hc.hosts if h.name == host)
    subprocess.run(where.nsenter_argv([sys.executable, "-c", CUT_SESSION, str(agent)]), check=True, timeout=30)
    wait_until(lambda: hosts_of(hc)[host]["agent"] is None or hosts_of(hc)[host]["agent"]["pid"] != agent, 60,
               "the controller to see the connection go")
    marker.touch()
    wait_until(lambda: len(hook_lines(hc, job_id)) == 6, 60, "the post hooks, with the connection gone")
    job = ended(hc, job_id)
    assert (job["state"], job["exit_code"]) == ("EXIT", 4)
    assert_hooks_once_in_order(hc, job_id, "EXIT", "", "4")


def test_a_job_that_ends_while_the_controller_is_killed_runs_its_post_hooks_once(hc: Cluster):
    marker = hc.work / f"go-{uuid.uuid4().hex[:6]}"
    job_id = submit(hc, "sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.1; done")
    hc.wait_state(job_id, {"RUN"}, timeout=60)
    wait_until(lambda: len(hook_lines(hc, job_id)) == 3, 30, "the pre hooks")
    hc.kill9_controller()
    marker.touch()
    wait_until(lambda: len(hook_lines(hc, job_id)) == 6, 60, "the post hooks, with no controller")
    hc.start()
    job = ended(hc, job_id)
    assert (job["state"], job["exit_code"]) == ("DONE", 0)
    assert_hooks_once_in_order(hc, job_id, "DONE", "", "0")


def test_a_failing_pre_hook_ends_the_job_exit_naming_it_and_the_post_hooks_run(hc: Cluster):
    ran = hc.work / f"ran-{uuid.uuid4().hex[:6]}"
    job_id = submit(hc, "touch", str(ran), app="failpre")
    job = ended(hc, job_id)
    reason = "pre_job_exec hook (profile) exited 3"
    assert (job["state"], job["reason"], job["exit_code"]) == ("EXIT", reason, None)
    assert not ran.exists()
    lines = hook_lines(hc, job_id)
    assert [what for _, what, _ in lines] == ["pre_host_exec profile", "pre_job_exec profile", "post_job_exec job",
                                              "post_job_exec profile", "post_host_exec profile"]
    assert [seen for _, _, seen in lines[2:]] == [f"EXIT|{reason}|"] * 3


def test_a_hung_post_hook_is_stopped_at_its_timeout_and_recorded(hc: Cluster):
    job_id = submit(hc, "true", app="hungpost")
    job = ended(hc, job_id)
    assert (job["state"], job["exit_code"]) == ("DONE", 0)  # post_failure: record
    assert job["reason"] == "post_job_exec hook (profile) timed out after 2 s"
    assert [what for _, what, _ in hook_lines(hc, job_id)] == FIRST_HOST
    with sqlite3.connect(f"file:{hc.home / 'xce.db'}?mode=ro", uri=True) as db:  # the finished event keeps them
        [(data,)] = db.execute("SELECT data FROM events WHERE job_id = ? AND kind = 'finished'", (job_id,)).fetchall()
    hooks = json.loads(data)["hooks"]
    assert [(h["point"], h["layer"], h["timed_out"]) for h in hooks] == [
        ("pre_host_exec", "profile", False), ("pre_job_exec", "profile", False), ("pre_job_exec", "job", False),
        ("post_job_exec", "job", False), ("post_job_exec", "profile", True), ("post_host_exec", "profile", False)]


def test_a_profile_can_refuse_a_jobs_own_hooks(hc: Cluster):
    refused = hc.xce("submit", "-app", "nojobhooks", "-E", "true", "--", "true")
    assert refused.returncode == 2 and "does not allow a job's own hooks (-E, -Ep)" in refused.stderr
    empty = hc.xce("submit", "-app", "hooked", "-Ep", " ", "--", "true")
    assert empty.returncode == 2 and "-Ep: give a shell command" in empty.stderr


# ---- several hosts: host hooks on each, job hooks on the first --------------------------------------


@pytest.fixture
def two_plain_hosts(require_testhosts, testhosts_root):
    require_testhosts(plain=True)
    d = testhosts_root / f"hooks-plain-{uuid.uuid4().hex[:6]}"
    try:
        yield testhosts.up(2, d, plain=True, die_with_caller=True, prefix="hp")
    finally:
        testhosts.down(d)


@pytest.mark.parametrize("kind", ["systemd", "plain"])
def test_a_multi_host_job_runs_host_hooks_on_each_host_once_and_job_hooks_on_the_first(kind, request,
                                                                                       testhosts_root):
    hosts = request.getfixturevalue("systemd_hosts" if kind == "systemd" else "two_plain_hosts")
    c = start(hosts, testhosts_root)
    try:
        job_id = submit(c, "true", options=("-n", "4", "-R", "span[ptile=2]"))
        job = ended(c, job_id)
        assert job["state"] == "DONE", job
        first, other = job["hosts"][0][0], job["hosts"][1][0]
        # the job ends with its first host's unit; the other's drains, running its post hook after
        wait_until(lambda: [what for where, what, _ in hook_lines(c, job_id) if where == other] == [
            "pre_host_exec profile", "post_host_exec profile"], 60, "the other host's post_host_exec")
        assert [what for where, what, _ in hook_lines(c, job_id) if where == first] == FIRST_HOST
        # and what the other host's hooks did is an event of the job (stored before it is forgotten)
        [event] = wait_until(lambda: host_hook_events(c, job_id), 60, "the other host's hooks recorded")
        assert event["data"]["host"] == other
        assert [(h["point"], h["ok"]) for h in event["data"]["hooks"]] == [("pre_host_exec", True),
                                                                            ("post_host_exec", True)]
        assert event["data"]["note"] is None
        assert f"host_hooks: on {other}, 2 ran, all ok" in c.ok("jobs", "-l", str(job_id))
        # a failing post_host_exec: recorded on the first host with the job, on the other in its event
        failing = submit(c, "true", app="failposthost", options=("-n", "4", "-R", "span[ptile=2]"))
        job = ended(c, failing)
        assert (job["state"], job["reason"]) == ("DONE", "post_host_exec hook (profile) exited 2")
        other = job["hosts"][1][0]
        [event] = wait_until(lambda: host_hook_events(c, failing), 60, "the other host's failed hook recorded")
        assert (event["data"]["host"], event["data"]["note"]) == (other, "post_host_exec hook (profile) exited 2")
    finally:
        close(c)


def host_hook_events(c: Cluster, job_id: int) -> list[dict]:
    history = json.loads(c.ok("jobs", "--json", "-l", str(job_id)))["jobs"][0]["history"]
    return [e for e in history if e["kind"] == "host_hooks"]
