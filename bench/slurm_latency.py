"""The extra latency of a job on a warm Slurm allocation, against the same job on a local host, in one run.

    python bench/slurm_latency.py [SAMPLES]

Starts a one-node Slurm on loopback (tests/support/slurm.py: munged, slurmctld, slurmd, in a temporary
directory of their own, stopped by PID at the end) and one controller whose cluster has a `local`
host (queue `local`) and two pools of one allocation each, never idle long enough to be released:
`hpc` (queue `hpc`, reached through `srun --overlap`) and `hpcd` (queue `direct`, `connect: direct`:
a TCP connection to the keeper). One job warms each allocation (its sbatch, start, relay and agent
are timed apart). Then SAMPLES jobs per queue, interleaved, each `sh -c 'date +%s.%N > F'`
submitted through the Python API:

- submit -> start: F's time minus time.time() just before the submit;
- submit -> done: until `wait` returns with the job DONE;
- stored stamps: the store's start_time - submit_time (the agent's clock at the fork, the
  controller's at the submit): no HTTP, no `sh`.

All hosts are this machine, and every agent runs jobs under the plain supervisor; what differs is
the way to the agent. Prints medians and p90s; asserts nothing.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's xce_lite and tests

from tests.support.slurm import SlurmCluster
from xce_lite import Cluster


QUEUES = ["local", "hpc", "direct"]
NAMES = {"local": "local", "hpc": "pool/srun", "direct": "pool/direct"}


def main(samples: int = 20) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="xb-slurm-"))
    slurm = SlurmCluster(tmp / "slurm").start()
    home = tmp / "h"
    home.mkdir()
    (home / "xce.yaml").write_text(textwrap.dedent(f"""\
        cluster: bs{os.getpid()}
        hosts:
          - name: local
            slots: 2
            mem: 1G
        queues:
          - name: local
            default: true
            hosts: [local]
          - name: hpc
            hosts: [hpc]
          - name: direct
            hosts: [hpcd]
        pools:
          - name: hpc
            type: slurm
            max_allocations: 1
            time_limit: 1h
            idle_timeout: 1h
            slots: 2
            mem: 512M
            python: {sys.executable}
          - name: hpcd
            type: slurm
            connect: direct
            max_allocations: 1
            time_limit: 1h
            idle_timeout: 1h
            slots: 2
            mem: 512M
            python: {sys.executable}
        controller:
          tick: 1s
          grace: 2s
        """))
    env = dict(os.environ, SLURM_CONF=str(slurm.conf), XCE_HOME=str(home))
    xce = [sys.executable, "-m", "xce_lite"]
    subprocess.run([*xce, "controller", "start"], env=env, check=True, capture_output=True)
    os.environ["SLURM_CONF"] = str(slurm.conf)
    try:
        with Cluster(home) as c:
            for queue in QUEUES[1:]:
                began = time.time()
                c.wait(c.submit(["true"], queue=queue, cwd=str(tmp)))
                print(f"cold: first job on pool {queue} (sbatch, allocation start, relay, agent): "
                      f"{time.time() - began:.2f} s")
            starts: dict[str, list[float]] = {q: [] for q in QUEUES}
            dones: dict[str, list[float]] = {q: [] for q in QUEUES}
            stamps: dict[str, list[float]] = {q: [] for q in QUEUES}
            for i in range(samples):
                for queue in QUEUES[i % 3:] + QUEUES[:i % 3]:
                    stamp = tmp / f"{queue}-{i}"
                    t0 = time.time()
                    job = c.submit(["sh", "-c", f"date +%s.%N > {stamp}"], queue=queue, cwd=str(tmp))
                    [done] = c.wait(job)
                    t1 = time.time()
                    assert done["state"] == "DONE", done
                    starts[queue].append(float(stamp.read_text()) - t0)
                    dones[queue].append(t1 - t0)
                    stamps[queue].append(done["start_time"] - done["submit_time"])
        print(f"{samples} samples per queue, interleaved; milliseconds (median / p90)")
        for label, data in (("submit -> start", starts), ("submit -> done", dones),
                            ("stored stamps", stamps)):
            row = {q: (statistics.median(v) * 1000, sorted(v)[int(0.9 * (len(v) - 1))] * 1000) for q, v in data.items()}
            cells = [f"{NAMES[q]} {row[q][0]:6.1f} / {row[q][1]:6.1f}" for q in QUEUES]
            extra = [f"{row[q][0] - row['local'][0]:+6.1f}" for q in QUEUES[1:]]
            print(f"  {label:16} " + "   ".join(cells) + f"   extra (medians) {' '.join(extra)}")
    finally:
        subprocess.run([*xce, "controller", "stop"], env=env, capture_output=True)
        slurm.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
