"""End to end: nothing a job starts outlives it where the plain supervisor runs it, through the real
controller and CLI: on this machine's own host (the agent in plain mode: no systemd here) and on a
plain test host over SSH.

Each job starts a background child and a setsid child and writes their pids; an application profile
gives it a post hook that logs, for each pid, whether it still names a process. One cluster runs, in
sequence, a job that ends by itself, a job killed with `xce kill`, and a job killed at its run limit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, hosts_of, hosts_ok
from tests.support.remote import close, remote_config
from tests.support.waiting import wait_until

JOB = ("export W={base}/j$XCE_JOBID; mkdir $W; sleep 1000 & echo $! > $W/bg;"
       " setsid sh -c 'echo $$ > $W/sid.tmp; mv $W/sid.tmp $W/sid; exec sleep 1000' &"
       " while [ ! -s $W/sid ]; do sleep 0.02; done; {then}")
POST = ('W=$BASE/j$XCE_JOBID; for p in $(cat "$W"/bg "$W"/sid); do'
        ' if kill -0 "$p" 2>/dev/null; then echo alive; else echo gone; fi; done >> "$W"/post.log')


@pytest.fixture(scope="module", params=["local", "plain-host"])
def tc(request, testhosts_root):
    """(a cluster with the profile `tree`, a function: is this pid of the job's host alive?, its kill)."""
    work = testhosts_root / f"work-{uuid.uuid4().hex[:8]}"
    if request.param == "local":
        c = Cluster(work=work)
        host = None
    else:
        host = request.getfixturevalue("plain_hosts")[0]
        c = Cluster(config=remote_config([host]).replace(f"cluster: rm{os.getpid()}", f"cluster: tr{os.getpid()}"),
                    work=work)
    apps = {"applications": {"tree": {"env": {"BASE": str(work)},
                                      "hooks": {"post_job_exec": {"argv": ["/bin/sh", "-c", POST]}}}}}
    (c.home / "applications.yaml").write_text(json.dumps(apps))
    c.start()
    hosts_ok(c, "the host up")

    def alive(pid: int) -> bool:
        if host is None:
            return Path(f"/proc/{pid}").exists()
        return subprocess.run(host.nsenter_argv(["test", "-e", f"/proc/{pid}"]), timeout=30).returncode == 0

    def kill(pid: int) -> None:
        if host is None:
            os.kill(pid, signal.SIGKILL)
        else:
            subprocess.run(host.nsenter_argv(["kill", "-9", str(pid)]), timeout=30)

    try:
        yield c, alive, kill
    finally:
        try:
            for w in c.work.glob("j*"):  # nothing of a failed test runs on
                for pid in pids(w):
                    if alive(pid):
                        kill(pid)
        finally:
            close(c)


def run(tc, then: str, options: tuple[str, ...] = ()) -> tuple[int, Path]:
    c, _, _ = tc
    job_id = c.submit("/bin/sh", "-c", JOB.format(base=c.work, then=then), options=("-app", "tree", *options))
    return job_id, c.work / f"j{job_id}"


def pids(w: Path) -> list[int]:
    return [int((w / name).read_text()) for name in ("bg", "sid") if (w / name).exists()]


def check_gone(tc, w: Path) -> None:
    alive = tc[1]
    assert [pid for pid in pids(w) if alive(pid)] == []
    assert (w / "post.log").read_text().split() == ["gone", "gone"]  # once, after the tree was gone


def test_leftovers_are_killed_however_the_job_ends_and_its_reason_says_so(tc):
    c = tc[0]
    user = os.environ.get("USER") or "root"

    done, w_done = run(tc, "exit 0")
    job = c.wait_state(done, {"DONE", "EXIT"}, timeout=60)
    assert (job["state"], job["exit_code"], job["reason"]) == ("DONE", 0, "2 leftover processes killed")
    check_gone(tc, w_done)

    killed, w_killed = run(tc, "touch $W/ready; sleep 1000")
    wait_until(lambda: (w_killed / "ready").exists(), 60, "the job to have started its children")
    c.ok("kill", str(killed))
    job = c.wait_state(killed, {"DONE", "EXIT"}, timeout=60)
    # the background child is in the job's process group and went with the kill; the setsid one is left
    assert (job["state"], job["reason"]) == ("EXIT", f"killed by {user}; 1 leftover process killed")
    check_gone(tc, w_killed)

    limited, w_limited = run(tc, "sleep 1000", options=("-W", "2s"))
    job = c.wait_state(limited, {"DONE", "EXIT"}, timeout=60)
    assert (job["state"], job["reason"]) == ("EXIT", "run limit 00:00:02 reached; 1 leftover process killed")
    check_gone(tc, w_limited)
    assert "1 leftover process killed" in c.ok("jobs", "-l", str(limited))


def test_leftovers_are_killed_when_the_job_ends_after_a_controller_kill_and_an_agent_kill(tc):
    """Faults in sequence while the job runs: the controller killed -9 and restarted, then the
    host's agent killed (the link makes a new one); the supervisor outlives both, and when the job
    ends its leftovers go, its post hook runs once, and its reason says so."""
    c, _, kill = tc
    job_id, w = run(tc, "touch $W/ready; while [ ! -e $W/go ]; do sleep 0.1; done; exit 0")
    wait_until(lambda: (w / "ready").exists(), 60, "the job to have started its children")
    c.kill9_controller()
    c.start()
    hosts_ok(c, "the host back")
    [host] = hosts_of(c).values()
    kill(host["agent"]["pid"])  # as the host sees it (a plain test host has its own pid namespace)
    wait_until(lambda: hosts_of(c)[host["name"]]["agent"]["pid"] != host["agent"]["pid"]
               and hosts_of(c)[host["name"]]["state"] == "ok", 60, "a new agent")
    assert c.job(job_id)["state"] == "RUN"
    (w / "go").touch()
    job = c.wait_state(job_id, {"DONE", "EXIT"}, timeout=60)
    assert (job["state"], job["attempt"], job["reason"]) == ("DONE", 1, "2 leftover processes killed")
    check_gone(tc, w)
