"""A job on a pool's allocation that dies of a signal nobody of ours sent: its end waits for Slurm's word.

When Slurm ends an allocation (scancel, its time limit) it signals every process in it; the job's
supervisor records that end and the node's agent may report it before it dies itself (observed under
load: the job then ended EXIT where it should have been requeued, as for a lost host). Here the order is
made certain: slurmd is frozen (SIGSTOP), so Slurm's end of the allocation (scancel) signals nothing
yet, and the pool's squeue is held at a gate (a wrapper on the controller's PATH); then the job is
killed with SIGKILL from outside, after the allocation's end, and its end reaches the controller and
waits, across a kill -9 and restart of the controller (which finds the allocation ended before it
linked its host again: the job is requeued all the same). The gate opened, Slurm says the
allocation ended: the job is requeued and runs DONE on a fresh allocation. In sequence, a job
killed from outside while its allocation keeps running: its end counts once Slurm says so (EXIT,
attempt 1).
"""

from __future__ import annotations

import os
import shutil
import signal
import time

from tests.support.slurm import SlurmCluster, allocations
from tests.support.waiting import wait_until

# exits 0 on its second attempt; on its first, writes its pid (that of `sleep`) and sleeps
ONCE = 'p="$1"; [ -e "$p" ] && exit 0; echo $$ > "$p"; exec sleep 300'


def gated_squeue(directory) -> tuple[dict[str, str], object]:
    """A PATH with an `squeue` first that waits while the file GATE exists, then runs the real one."""
    bindir, gate = directory / "bin", directory / "gate"
    bindir.mkdir()
    wrapper = bindir / "squeue"
    wrapper.write_text(f"#!/bin/sh\nwhile [ -e {gate} ]; do sleep 0.05; done\n"
                       f"exec {shutil.which('squeue')} \"$@\"\n")
    wrapper.chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}, gate


def pid_in(path) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip(), 30, f"{path} to hold the job's pid")
    return int(path.read_text())


def test_an_end_by_an_outside_signal_waits_for_slurm_requeued_if_the_allocation_ended(pool_cluster,
                                                                                      slurm: SlurmCluster, tmp_path):
    env, gate = gated_squeue(tmp_path)
    c = pool_cluster(env=env, extra="\n            connect: direct")
    pidfile = c.work / "first.pid"
    job = c.submit("sh", "-c", ONCE, "sh", str(pidfile), options=("-q", "hpc"))
    c.wait_state(job, {"RUN"}, timeout=90)
    [alloc] = allocations(c, "running")
    slurmd = next(d.proc for d in slurm.daemons if d.name.startswith("slurmd"))
    gate.touch()  # Slurm's answers to the pool wait from now on
    os.kill(slurmd.pid, signal.SIGSTOP)  # the allocation's end signals nothing until SIGCONT
    try:
        slurm.run("scancel", alloc["job_id"])
        wait_until(lambda: slurm.job_state(alloc["job_id"]) != "RUNNING", 30, "Slurm to end the allocation")
        time.sleep(1.1)  # Slurm's end time is in whole seconds: the kill comes after it
        os.kill(pid_in(pidfile), signal.SIGKILL)
        held = f"ended by signal {signal.SIGKILL.value}, sent by none of ours"
        wait_until(lambda: held in c.log_tail() or c.job(job)["state"] != "RUN", 30,
                   "the controller to hold the job's end (or end the job)")
        time.sleep(1.0)  # were the end counted, it would be stored by now
        assert c.job(job)["state"] == "RUN", c.job(job)  # not EXIT: its end waits for Slurm
        c.kill9_controller()  # a restart in the middle: what was held was in memory only
        c.start()
        time.sleep(1.0)
        assert c.job(job)["state"] == "RUN", c.job(job)
        gate.unlink()
    finally:
        os.kill(slurmd.pid, signal.SIGCONT)
        gate.unlink(missing_ok=True)
    wait_until(lambda: c.job(job)["attempt"] >= 2 or c.job(job)["state"] in ("DONE", "EXIT"), 60,
               f"job {job} to be requeued")
    assert c.job(job)["attempt"] == 2, c.job(job)
    done = c.wait_state(job, {"DONE", "EXIT"}, timeout=120)
    assert done["state"] == "DONE", done
    [fresh] = allocations(c, "running")
    assert fresh["job_id"] != alloc["job_id"] and done["hosts"][0][0] == fresh["hosts"][0]

    # the allocation keeps running: the end counts as it is, once Slurm has said so
    second = c.work / "second.pid"
    other = c.submit("sh", "-c", ONCE, "sh", str(second), options=("-q", "hpc"))
    c.wait_state(other, {"RUN"}, timeout=60)
    os.kill(pid_in(second), signal.SIGKILL)
    ended = c.wait_state(other, {"DONE", "EXIT"}, timeout=60)
    assert ended["state"] == "EXIT" and ended["attempt"] == 1 and ended["exit_signal"] == 9, ended
    assert [a["job_id"] for a in allocations(c, "running")] == [fresh["job_id"]]
