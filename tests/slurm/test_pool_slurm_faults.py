"""A pool whose slurmctld freezes, then dies and comes back: the controller's tick never waits for it.

The faults come in sequence on one real Slurm: the pool's first sbatch freezes slurmctld (SIGSTOP, by
an `sbatch` wrapper on the controller's PATH that stops it just before running the real one), so
that sbatch and every squeue after it hang; meanwhile a local job starts and ends DONE and the pool
shows Slurm's trouble in `xce hosts -l`. After SIGCONT the pool recovers and its job runs in the
allocation. Then slurmctld is killed (kill -9) while a job runs there: local work goes on, the pool
shows the trouble again; slurmctld restarts and the pool recovers, the job ends DONE. Through it
all: one allocation per decision (each of the pool's Slurm job names at most once).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections import Counter

import yaml

from tests.support.slurm import WAIT_FOR, SlurmCluster, allocations, pools
from tests.support.waiting import wait_until

# The old tick sat in a frozen sbatch or squeue for up to 30 s (exec/slurm.py TIMEOUT) every time
# it looked at Slurm: a local job then took several such waits to start and end. Here it must be
# DONE before the first of those deadlines could have passed.
LOCAL_JOB_DEADLINE = 25


def freezing_sbatch(directory, slurm: SlurmCluster) -> dict[str, str]:
    """A PATH with an `sbatch` first that SIGSTOPs slurmctld once, then runs the real one."""
    bindir = directory / "bin"
    bindir.mkdir()
    wrapper = bindir / "sbatch"
    wrapper.write_text(f"#!/bin/sh\n"
                       f"if [ ! -e {directory / 'froze'} ]; then touch {directory / 'froze'}; "
                       f"kill -STOP {slurm.ctld().pid}; fi\n"
                       f"exec {shutil.which('sbatch')} \"$@\"\n")
    wrapper.chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


def slurm_trouble(c) -> str | None:
    return pools(c)["hpc"]["trouble"]


def one_allocation_per_decision(c, slurm: SlurmCluster) -> list[str]:
    """The pool's Slurm jobs (every state slurmctld still knows): no job name twice."""
    cluster = yaml.safe_load((c.home / "xce.yaml").read_text())["cluster"]
    names = [j["name"] for j in slurm.jobs().values() if j["name"].startswith(f"xce-{cluster}-hpc-")]
    twice = [n for n, k in Counter(names).items() if k > 1]
    assert not twice, f"submitted twice: {twice}"
    return names


def test_a_frozen_then_dead_slurmctld_stalls_nothing_and_the_pool_recovers(pool_cluster, slurm: SlurmCluster,
                                                                           tmp_path):
    c = pool_cluster(env=freezing_sbatch(tmp_path, slurm))
    frozen = True
    try:
        go = c.work / "go"
        remote = c.submit(sys.executable, "-c", WAIT_FOR, str(go), options=("-q", "hpc"))
        wait_until(lambda: (tmp_path / "froze").exists(), 60, "the pool's sbatch to freeze slurmctld")
        # slurmctld is frozen, the sbatch hangs in it: local work goes on
        local = c.submit("true")
        assert c.wait_state(local, {"DONE", "EXIT"}, timeout=LOCAL_JOB_DEADLINE)["state"] == "DONE"
        trouble = wait_until(lambda: slurm_trouble(c), 60, "the pool to show Slurm's trouble")
        assert "Slurm in trouble" in c.ok("hosts", "-l") and trouble in c.ok("hosts", "-l")
        assert c.job(remote)["state"] == "PEND"
        os.kill(slurm.ctld().pid, signal.SIGCONT)
        frozen = False
        wait_until(lambda: slurm_trouble(c) is None, 60, "the pool to recover from the freeze")
        c.wait_state(remote, {"RUN"}, timeout=240)
        # observed: the frozen sbatch timed out ("Socket timed out"), yet slurmctld made the job
        # once it ran again: it is found by its name, not submitted again (nor marked failed)
        [alloc] = allocations(c)
        assert alloc["state"] == "running", alloc
        one_allocation_per_decision(c, slurm)

        # kill -9 of slurmctld while a job runs in the allocation: local work goes on, the pool
        # shows the trouble; slurmctld restarts, the pool recovers and the job ends DONE there.
        go.touch()
        assert c.wait_state(remote, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
        go2 = c.work / "go2"
        second = c.submit(sys.executable, "-c", WAIT_FOR, str(go2), options=("-q", "hpc"))
        c.wait_state(second, {"RUN"}, timeout=60)
        slurm.save_state(alloc["job_id"])  # its start is on disk: a restart knows it runs
        slurm.kill_ctld()
        local2 = c.submit("true")
        assert c.wait_state(local2, {"DONE", "EXIT"}, timeout=LOCAL_JOB_DEADLINE)["state"] == "DONE"
        wait_until(lambda: slurm_trouble(c), 60, "the pool to show that slurmctld is gone")
        assert c.job(second)["state"] == "RUN"
        slurm.restart_ctld()
        wait_until(lambda: slurm_trouble(c) is None, 60, "the pool to recover after slurmctld's restart")
        go2.touch()
        assert c.wait_state(second, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
        assert c.job(second)["hosts"][0][0] == alloc["hosts"][0]
        assert [a["job_id"] for a in allocations(c, "running")] == [alloc["job_id"]], allocations(c)
        names = one_allocation_per_decision(c, slurm)
        seqs = json.loads(c.ok("hosts", "-l", "--json"))["pools"][0]["allocations"]
        assert len(names) == len([a for a in seqs if a["job_id"]]), (names, seqs)
    finally:
        if frozen:
            os.kill(slurm.ctld().pid, signal.SIGCONT)  # the next tests need it
