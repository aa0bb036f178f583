"""A `type: slurm` pool end to end: the real controller, a real one-node Slurm, the `xce` CLI.

Jobs of a queue whose hosts name the pool wait until the controller's sbatch gets an allocation,
then run on its node (through the agent in the allocation's batch step) and end DONE; the faults
come in sequence: a controller kill -9 while a job runs there (the job goes on and is adopted, the
allocation is not submitted again), then a `scancel` of the allocation (its job is requeued and
runs again on a fresh allocation)."""

from __future__ import annotations

import json
import sys
import time

import pytest
import yaml

from tests.support.slurm import WAIT_FOR, SlurmCluster, allocations
from tests.support.waiting import wait_until
from xce_lite.exec import bundle
from xce_lite.exec import slurm as slurm_cmds
from xce_lite.store.jobs import JobStore


@pytest.mark.parametrize("connect", ["srun", "direct"])
def test_a_job_waits_for_an_allocation_runs_there_and_survives_faults(pool_cluster, slurm: SlurmCluster, connect):
    c = pool_cluster(extra=f"\n            connect: {connect}")
    assert allocations(c) == []
    out = c.work / "env.out"
    first = c.submit("sh", "-c", 'echo "$SLURM_JOB_ID $SLURM_JOB_NODELIST $XCE_JOBID $XCE_HOSTS"; cat "$XCE_HOSTFILE"',
                     options=("-q", "hpc", "-o", str(out)))
    done = c.wait_state(first, {"DONE", "EXIT"}, timeout=90)
    assert done["state"] == "DONE", done
    [alloc] = allocations(c, "running")
    # the hostfile names the node as Slurm does (mpirun there resolves it), XCE_HOSTS the xce host
    assert out.read_text().split() == [alloc["job_id"], slurm.node, str(first), f"hpc-{alloc['job_id']}",
                                       slurm.node, "slots=1"]
    assert done["hosts"][0][0] == f"hpc-{alloc['job_id']}" == alloc["hosts"][0]
    assert slurm.job_state(alloc["job_id"]) == "RUNNING"
    text = c.ok("hosts", "-l")
    assert "POOL hpc" in text and alloc["job_id"] in text and "running" in text

    # kill -9 of the controller while a job runs in the allocation: the job goes on, the restarted
    # controller adopts the allocation (no second sbatch) and the job, which ends DONE.
    go = c.work / "go"
    second = c.submit(sys.executable, "-c", WAIT_FOR, str(go), options=("-q", "hpc"))
    c.wait_state(second, {"RUN"}, timeout=60)
    c.kill9_controller()
    c.start()
    go.touch()
    assert c.wait_state(second, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
    assert [a["job_id"] for a in allocations(c, "running")] == [alloc["job_id"]]
    live = [j for j in slurm.jobs().values() if j["job_state"] in ("PENDING", "RUNNING")]
    assert [str(j["job_id"]) for j in live] == [alloc["job_id"]]

    # scancel of the allocation: its job is requeued, and runs again on a new allocation.
    go2 = c.work / "go2"
    third = c.submit(sys.executable, "-c", WAIT_FOR, str(go2), options=("-q", "hpc"))
    c.wait_state(third, {"RUN"}, timeout=60)
    slurm.run("scancel", alloc["job_id"])
    wait_until(lambda: c.job(third)["attempt"] >= 2 or c.job(third)["state"] in ("DONE", "EXIT"), 60,
               f"job {third} to be requeued")
    assert c.job(third)["state"] in ("PEND", "DISP", "RUN")
    wait_until(lambda: "CANCELLED" in next(a["reason"] for a in allocations(c) if a["job_id"] == alloc["job_id"]),
               30, "the allocation to show as ended, CANCELLED")
    c.wait_state(third, {"RUN"}, timeout=90)
    go2.touch()
    assert c.wait_state(third, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
    [fresh] = allocations(c, "running")
    assert fresh["job_id"] != alloc["job_id"]


def test_an_allocation_drains_before_its_time_limit_and_is_released(pool_cluster, slurm: SlurmCluster):
    c = pool_cluster(time_limit="1m")
    short = c.submit("true", options=("-q", "hpc", "-W", "30s"))
    assert c.wait_state(short, {"DONE", "EXIT"}, timeout=90)["state"] == "DONE"
    [alloc] = allocations(c, "running")
    # Once less than 45 s are left, a job of -W 45 may not go there: the allocation drains, is
    # released (max_allocations 1 leaves no room beside it) and a fresh one runs the job.
    wait_until(lambda: (allocations(c, "running") or [{"time_left": 0}])[0]["time_left"] < 44, 60,
               "the allocation's time left to fall under 45 s")
    longer = c.submit("true", options=("-q", "hpc", "-W", "45s"))
    assert c.wait_state(longer, {"DONE", "EXIT"}, timeout=120)["state"] == "DONE"
    job = c.job(longer)
    old = next(a for a in allocations(c) if a["job_id"] == alloc["job_id"])
    assert old["state"] == "ended" and "draining" in old["reason"], old
    assert job["hosts"][0][0] != f"hpc-{alloc['job_id']}"


def test_slurms_reasons_show_for_a_pending_or_failed_sbatch(pool_cluster, slurm: SlurmCluster):
    # A job of the whole node holds it: the pool's allocation pends, with Slurm's reason.
    blocker = slurm.sbatch(f"--cpus-per-task={slurm.cpus}", "--wrap", "sleep 300", "-o", "/dev/null")
    wait_until(lambda: slurm.job_state(blocker) == "RUNNING", 60, "the blocker to run")
    c = pool_cluster()
    job = c.submit("true", options=("-q", "hpc"))
    [pending] = wait_until(lambda: allocations(c, "pending"), 60, "an allocation to pend")
    wait_until(lambda: allocations(c, "pending")[0]["reason"] == "Resources", 30, "Slurm's reason to show")
    text = c.ok("hosts", "-l")
    assert pending["job_id"] in text and "pending" in text and "Resources" in text
    assert c.job(job)["state"] == "PEND"
    waits_for = f"pool hpc: allocation {pending['job_id']} pending in Slurm (Resources)"
    wait_until(lambda: c.job(job)["pend_reason"] == waits_for, 30, "the pend reason to say what the pool does")
    assert waits_for in c.ok("why", str(job))
    # A -W that no allocation of the queue's pool can hold is refused at submit.
    refused = c.xce("submit", "-q", "hpc", "-W", "6m", "--", "true")
    assert refused.returncode != 0 and "longer than any allocation" in refused.stderr, refused.stderr
    slurm.run("scancel", blocker)
    assert c.wait_state(job, {"DONE", "EXIT"}, timeout=90)["state"] == "DONE"
    assert [a["job_id"] for a in allocations(c, "running")] == [pending["job_id"]]


def test_a_failed_sbatch_shows_slurms_words(pool_cluster):
    c = pool_cluster(extra="\n            partition: nosuch")
    job = c.submit("true", options=("-q", "hpc"))
    [failed] = wait_until(lambda: allocations(c, "failed"), 60, "the sbatch to fail")
    assert failed["job_id"] is None and "sbatch failed" in failed["reason"]
    assert "invalid partition" in failed["reason"].lower(), failed["reason"]
    text = c.ok("hosts", "-l")
    assert "POOL hpc" in text and "failed" in text and "invalid partition" in text.lower()
    assert c.job(job)["state"] == "PEND"


def test_an_idle_allocation_is_released_after_idle_timeout(pool_cluster, slurm: SlurmCluster):
    c = pool_cluster(idle_timeout="3s")
    job = c.submit("true", options=("-q", "hpc"))
    assert c.wait_state(job, {"DONE", "EXIT"}, timeout=90)["state"] == "DONE"
    [alloc] = allocations(c, "running")
    ended = wait_until(lambda: next(a for a in allocations(c) if a["job_id"] == alloc["job_id"])["state"] == "ended"
                       and next(a for a in allocations(c) if a["job_id"] == alloc["job_id"]), 60,
                       "the idle allocation to be released")
    assert "released: idle for" in ended["reason"], ended
    wait_until(lambda: slurm.job_state(alloc["job_id"]) == "CANCELLED", 30, "Slurm to say CANCELLED")


def test_an_sbatch_the_controller_did_not_live_to_record_is_adopted(pool_cluster, slurm: SlurmCluster):
    c = pool_cluster()
    c.ok("controller", "stop")
    # As if the controller had died between its sbatch and the record of the job id: the intent
    # (the pool's sequence number 1) is stored, and Slurm has the allocation under its name.
    store = JobStore(c.home / "xce.db")
    store.set_meta("slurm_pools", json.dumps(
        {"seq": 1, "allocations": [{"pool": "hpc", "seq": 1, "submit_time": time.time()}]}))
    store.close()
    cluster = yaml.safe_load((c.home / "xce.yaml").read_text())["cluster"]
    directory = c.home / "slurm" / "hpc"
    agent = bundle.install(directory)
    script = c.root / "batch.sh"
    script.write_text(slurm_cmds.batch_script("hpc", str(directory), sys.executable, str(agent), 1))
    job_id = slurm.sbatch(f"--job-name=xce-{cluster}-hpc-1", "--cpus-per-task=2", "--time=5",
                          f"--output={directory}/slurm-%j.out", str(script))
    c.start()
    job = c.submit("true", options=("-q", "hpc"))
    assert c.wait_state(job, {"DONE", "EXIT"}, timeout=90)["state"] == "DONE"
    assert [a["job_id"] for a in allocations(c)] == [job_id]
    assert c.job(job)["hosts"][0][0] == f"hpc-{job_id}"
