"""A backlog through the real controller: thousands of jobs pending behind two sleepers, so sessions
cross to the scheduler's worker (whole set sent in pieces, the inline side letting go) and back
inline as the backlog drains; in sequence, the worker SIGKILLed, then the controller SIGKILLed and
started again, then the sleepers killed. Every job runs once (its own ledger line), DONE. (Not
"attempt 1": a queued successor withdrawn unstarted, as a recovered one may be, runs as attempt 2.)"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import psutil

from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from xce_lite.api.client import Client

JOBS = 2500  # past sched_switch.UP (1,000) with room: the worker takes over, pieces of 1,000


def _worker_pids(c: Cluster) -> list[int]:
    """The scheduler's worker: a child of the controller's forkserver."""
    pid = c.controller_pid
    if pid is None:
        return []
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "forkserver" in " ".join(child.cmdline()):
                found += [p.pid for p in child.children()]
        except psutil.NoSuchProcess:
            pass
    return found


def _pend_reason_of(c: Cluster, job_id: int) -> str:
    api = Client(c.home / "xce.sock")
    try:
        return api.get("/jobs", ids=str(job_id))["jobs"][0]["pend_reason"] or ""
    finally:
        api.close()


def test_a_backlog_drains_through_the_worker_and_back_each_job_once_through_kills_and_a_restart(
        cluster: Cluster):
    c = cluster
    sleepers = [c.submit("sleep", "600") for _ in range(2)]
    for job_id in sleepers:
        c.wait_state(job_id, {"RUN"})
    ledger = c.work / "ledger"  # each run appends its job's id (O_APPEND: whole lines)
    spec = {"argv": ["sh", "-c", f'echo "$XCE_JOBID" >> {ledger}'], "cwd": str(c.work), "stdout": os.devnull,
            "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}}
    api = Client(c.home / "xce.sock")
    ids: list[int] = []
    try:
        for _ in range(JOBS // 500):
            ids += api.post("/jobs", {"jobs": [spec] * 500})["ids"]
    finally:
        api.close()
    wait_until(lambda: _pend_reason_of(c, ids[-1]), 60, "a session to give the last job its reason")
    wait_until(lambda: _worker_pids(c), 30, "the scheduler's worker to run")

    for pid in _worker_pids(c):  # the worker dies: the next session starts one and sends the set again
        os.kill(pid, signal.SIGKILL)
    extra = c.submit("true")  # a change, so a session runs and meets the dead worker
    wait_until(lambda: _pend_reason_of(c, extra), 60, "a session after the worker's death")

    c.kill9_controller()  # then the controller: restarted, it reloads the backlog
    c.start()
    wait_until(lambda: _pend_reason_of(c, ids[-1]), 60, "a session after the restart")

    c.ok("kill", *map(str, sleepers))
    deadline = time.monotonic() + 300
    api = Client(c.home / "xce.sock")
    try:
        while True:
            reply = api.get("/jobs/wait", ids=",".join(map(str, [*ids, extra])), timeout=60)
            if reply["finished"] or time.monotonic() > deadline:
                break
        jobs = api.get("/jobs", ids=",".join(map(str, [*ids, extra])))["jobs"]
    finally:
        api.close()
    assert reply["finished"], "the backlog did not drain within 300 s"
    assert {j["state"] for j in jobs} == {"DONE"} and len(jobs) == JOBS + 1
    ran = Counter(int(line) for line in ledger.read_text().split())
    assert sorted(ran) == sorted(ids) and max(ran.values()) == 1  # each ran, none twice
    assert "Traceback" not in c.log_tail(2000)
