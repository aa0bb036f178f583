"""Shared by the prefill tests (issue 18): jobs that count their runs, and waits on queued successors."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster import Cluster
from tests.support.waiting import wait_until


def held(c: Cluster, name: str, *options: str) -> int:
    """A job that appends its attempt to work/NAME.runs, then runs until work/go-NAME exists."""
    runs, go = c.work / f"{name}.runs", c.work / f"go-{name}"
    return c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done',
                    options=options)


def quick(c: Cluster, name: str, *options: str) -> int:
    """A job that appends its attempt to work/NAME.runs and ends."""
    return c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {c.work / f"{name}.runs"}', options=options)


def runs(c: Cluster, name: str) -> list[str]:
    path: Path = c.work / f"{name}.runs"
    return path.read_text().split() if path.exists() else []


def pending(c: Cluster, job_id: int) -> bool:
    """Whether `job_id` is PEND and queued nowhere (a queued successor shows PEND too)."""
    job = c.job(job_id)
    return job["state"] == "PEND" and job["queued_behind"] is None


def queued(c: Cluster, job_id: int, host: str, after: int) -> dict:
    """Wait until `job_id` is queued on `host` behind `after` (stored DISP, shown PEND); its row. On
    a timeout the message has the job's and its predecessor's rows and the controller's log."""
    want = f"queued on {host} behind job {after}"
    try:
        return wait_until(lambda: (j := c.job(job_id))["state"] == "PEND" and j["queued_behind"] == after
                          and j["hosts"][0][0] == host and j, 30, f"job {job_id} to be {want}")
    except AssertionError as err:
        raise AssertionError(f"{err}\njob {job_id}: {c.job(job_id)}\njob {after}: {c.job(after)}\n"
                             f"controller log:\n{c.log_tail(40)}") from None


def agent_pid(c: Cluster, host: str) -> int:
    return int((c.home / "spool" / host / ".lock").read_text().split()[0])  # the serving agent's


def two_busy_hosts(c: Cluster) -> tuple[int, int, int]:
    """(long on a, other on b, s): s queued on a behind the long job, both hosts full."""
    long, other = held(c, "long", "-R", "select[ha]"), held(c, "other", "-R", "select[hb]")
    c.wait_state(long, {"RUN"}), c.wait_state(other, {"RUN"})
    s = quick(c, "s")
    queued(c, s, "a", long)  # units are offered host by host: a's first
    return long, other, s
