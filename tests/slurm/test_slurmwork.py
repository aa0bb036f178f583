"""controller/slurmwork.py: the pools' Slurm commands on a worker per pool, their outcomes as events.

The commands here are plain functions standing for Slurm's (the workers' contract is what they do
with any command: order, one pool never waiting for another, outcomes and errors reported)."""

from __future__ import annotations

import threading

from tests.support.waiting import wait_until
from xce_lite.controller.slurmwork import Cancelled, Polled, SlurmWork, Submitted
from xce_lite.exec import slurm


def test_a_hung_command_holds_up_only_its_own_pool_and_outcomes_come_in_order():
    woken = threading.Event()
    work = SlurmWork(woken.set)
    release = threading.Event()
    try:
        work.poll("frozen", lambda: release.wait(30) and {})
        work.submit("frozen", 1, lambda: "41")  # queued behind the hung poll: the same pool's order
        work.poll("other", lambda: {})
        work.submit("other", 7, lambda: "42")
        work.cancel("other", "40", lambda: None)
        got: list = []
        wait_until(lambda: got.extend(work.results()) or len(got) == 3, 10, "the other pool's outcomes")
        assert [type(r) for r in got] == [Polled, Submitted, Cancelled] and {r.pool for r in got} == {"other"}
        assert woken.is_set()
        assert work.outstanding("frozen", "poll") == 1 and work.outstanding("frozen", "submit") == 1
        assert work.outstanding("other", "poll") == 0
        release.set()
        late: list = []
        wait_until(lambda: late.extend(work.results()) or len(late) == 2, 10, "the frozen pool's outcomes")
        assert late[0] == Polled("frozen", late[0].began, {}) and late[1].job_id == "41" and late[1].seq == 1
        assert not work.busy()
    finally:
        release.set()
        work.close()


def test_failures_are_reported_and_a_timed_out_sbatch_is_unsure():
    work = SlurmWork(lambda: None)

    def hung_sbatch() -> str:
        raise slurm.SlurmError("sbatch did not answer within 30 s; is slurmctld up (`scontrol ping`)?")

    def refused_sbatch() -> str:
        raise slurm.SlurmError("sbatch failed: sbatch: error: invalid partition specified: nosuch")

    def broken_squeue() -> dict:
        raise ValueError("a bug")

    try:
        work.submit("p", 1, hung_sbatch)
        work.submit("p", 2, refused_sbatch)
        work.poll("p", broken_squeue)
        got: list = []
        wait_until(lambda: got.extend(work.results()) or len(got) == 3, 10, "three outcomes")
        unsure, refused, polled = got
        assert unsure.job_id is None and unsure.unsure and "did not answer" in unsure.error
        assert refused.job_id is None and not refused.unsure and "invalid partition" in refused.error
        assert polled.jobs is None and "unexpected error" in polled.error
    finally:
        work.close()
