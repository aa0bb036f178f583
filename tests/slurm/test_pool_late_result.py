"""A job that ends in the last moments of its allocation counts: DONE, not requeued.

Its end is recorded in the node's journal (on the file system the nodes share with the controller)
but its report over the relay never comes: the relay is frozen (SIGSTOP of the controller's `srun`
client, as a relay slow or dead at the allocation's end would be) before the job ends, 3 s before
the allocation's time limit. Slurm then ends the allocation; the controller reads the job's end from
the journal, and it counts because it came before the allocation's end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from tests.support.slurm import SlurmCluster, allocations
from tests.support.waiting import wait_until

ENDS_AT = "import sys, time\ntime.sleep(max(0.0, float(sys.argv[1]) - time.time()))\n"


def relay_of(controller: int, job_id: str) -> int:
    """The pid of the controller's `srun` relay into allocation `job_id`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == controller and argv and argv[0].endswith(b"srun") and f"--jobid={job_id}".encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no srun relay of the controller ({controller}) into allocation {job_id}")


def test_a_job_ending_just_before_its_allocation_does_counts(pool_cluster, slurm: SlurmCluster):
    c = pool_cluster(time_limit="1m")
    first = c.submit("true", options=("-q", "hpc"))
    assert c.wait_state(first, {"DONE", "EXIT"}, timeout=90)["state"] == "DONE"
    [alloc] = allocations(c, "running")
    end = time.time() + alloc["time_left"]
    late = c.submit(sys.executable, "-c", ENDS_AT, str(end - 3), options=("-q", "hpc"))
    c.wait_state(late, {"RUN"}, timeout=30)
    assert c.job(late)["hosts"][0][0] == alloc["hosts"][0]
    relay = relay_of(c.controller_pid, alloc["job_id"])
    os.kill(relay, signal.SIGSTOP)  # its report of the job's end cannot come through
    try:
        wait_until(lambda: next(a for a in allocations(c) if a["job_id"] == alloc["job_id"])["state"] == "ended",
                   120, "the allocation to reach its time limit")
        job = c.wait_state(late, {"DONE", "EXIT"}, timeout=30)
        assert job["state"] == "DONE" and job["attempt"] == 1, job
    finally:
        try:
            os.kill(relay, signal.SIGCONT)
        except ProcessLookupError:
            pass
