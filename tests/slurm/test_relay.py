"""The agent inside a real Slurm allocation: started by the batch script's keeper, reached through a
relay (`srun --overlap`) that can be killed, as a controller crash would, without harm to the jobs."""

from __future__ import annotations

import os
import queue
import signal
import sys

import pytest

from tests.exec.test_agent import WAIT_JOB
from tests.support.slurm import SlurmCluster
from tests.support.waiting import wait_until
from xce_lite.exec import bundle, slurm
from xce_lite.exec.host import HostLost, LaunchRequest, UnitFinished
from xce_lite.exec.slurmhost import SlurmHost


@pytest.fixture
def allocation(slurm: SlurmCluster, tmp_path, monkeypatch):
    """A running allocation of pool `p` whose node runs the keeper: (job id, pool dir, agent file)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    pool_dir = tmp_path / "pool"
    agent = bundle.install(pool_dir)
    script = slurm_mod.batch_script("p", str(pool_dir), sys.executable, str(agent), 1)
    job = slurm_mod.sbatch(script, ["--job-name=xce-p", f"--output={pool_dir}/slurm-%j.out", "--time=10"])
    wait_until(lambda: slurm_mod.squeue([job]).get(job) and slurm_mod.squeue([job])[job].state == "RUNNING",
               60, f"allocation {job} to run")
    yield job, pool_dir, agent
    slurm.run("scancel", job, check=False)
    wait_until(lambda: not slurm_mod.squeue([job]) or slurm_mod.squeue([job])[job].ended, 60, f"{job} to end")


slurm_mod = slurm


def waiter(tmp_path, unit: str) -> LaunchRequest:
    return LaunchRequest(unit=unit, argv=(sys.executable, "-c", WAIT_JOB, str(tmp_path / f"go-{unit}"), "0"),
                         env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path), stdout=str(tmp_path / f"{unit}.out"),
                         stderr=None)


def test_job_outlives_a_killed_relay_and_is_adopted(slurm: SlurmCluster, allocation, tmp_path) -> None:
    job, pool_dir, agent = allocation
    [info] = slurm_mod.squeue([job]).values()
    assert info.nodes == (slurm.node,) and info.time_limit == 600
    host = SlurmHost(f"p-{job}", job, slurm.node, pool_dir, agent)
    events: queue.Queue = queue.Queue()
    probe = host.connect(events)
    assert probe.extra["mode"] == "plain" and probe.extra["spool"] == str(pool_dir / job / slurm.node / "spool")
    first_agent = probe.extra["pid"]
    [reply] = host.launch([waiter(tmp_path, "u1")])
    assert reply.status == "started"

    # A controller crash: its srun client dies at once; Slurm ends that step, and the agent in the
    # batch step reads EOF and exits. The job goes on, in the allocation.
    os.kill(host.agent_pid, signal.SIGKILL)
    wait_until(lambda: isinstance(_next(events), HostLost), 30, "the relay's loss")
    host.close()
    wait_until(lambda: not os.path.exists(f"/proc/{first_agent}"), 30, f"the first agent ({first_agent}) to exit")
    assert slurm_mod.squeue([job])[job].state == "RUNNING"

    # A new relay (twice: the second connection replaces the first) finds the job still running.
    again = SlurmHost(f"p-{job}", job, slurm.node, pool_dir, agent)
    again.connect(queue.Queue())
    events2: queue.Queue = queue.Queue()
    try:
        again.connect(events2)
        [unit] = again.list_units()
        assert unit.unit == "u1" and unit.status == "running"
        (tmp_path / "go-u1").touch()
        finished = wait_until(lambda: _next(events2), 30, "u1's end")
        assert isinstance(finished, UnitFinished) and finished.unit == "u1" and finished.result.exit_code == 0
    finally:
        again.close()


def _next(events: queue.Queue):
    try:
        return events.get(timeout=0.5)
    except queue.Empty:
        return None
