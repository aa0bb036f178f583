"""The extra latency of a job on a warm Slurm allocation, against the same job on a local host, in one run.

    python bench/slurm_latency.py [SAMPLES]

Starts a one-node Slurm on loopback (tests/support/slurm.py: munged, slurmctld, slurmd, in a temporary
directory of their own, stopped by PID at the end) and one controller whose cluster has a `local`
host (queue `local`) and a pool `hpc` (queue `hpc`, one allocation, never idle long enough to be
released). One job warms the allocation (its sbatch, start, relay and agent are not measured). Then
SAMPLES jobs per queue, interleaved, each `sh -c 'date +%s.%N > F'` submitted through the Python API:

- submit -> start: F's time minus time.time() just before the submit;
- submit -> done: until `wait` returns with the job DONE;
- stored stamps: the store's start_time - submit_time (the agent's clock at the fork, the
  controller's at the submit): no HTTP, no `sh`.

Both hosts are this machine; the pool's jobs go through `srun --overlap` (the relay) to the agent in
the allocation's batch step, so the difference is the relay's hop plus the pool's host in the
scheduler. Prints medians and p90s; asserts nothing.
"""

from __future__ import annotations

import os
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
        pools:
          - name: hpc
            type: slurm
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
            began = time.time()
            warm = c.submit(["true"], queue="hpc")
            c.wait(warm)
            print(f"cold: first job on the pool (sbatch, allocation start, relay, agent): {time.time() - began:.2f} s")
            starts: dict[str, list[float]] = {"local": [], "hpc": []}
            dones: dict[str, list[float]] = {"local": [], "hpc": []}
            stamps: dict[str, list[float]] = {"local": [], "hpc": []}
            for i in range(samples):
                for queue in ("local", "hpc") if i % 2 else ("hpc", "local"):
                    stamp = tmp / f"{queue}-{i}"
                    t0 = time.time()
                    job = c.submit(["sh", "-c", f"date +%s.%N > {stamp}"], queue=queue)
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
            extra = row["hpc"][0] - row["local"][0]
            print(f"  {label:16} local {row['local'][0]:7.1f} / {row['local'][1]:7.1f}   "
                  f"slurm pool {row['hpc'][0]:7.1f} / {row['hpc'][1]:7.1f}   extra (median) {extra:+7.1f}")
    finally:
        subprocess.run([*xce, "controller", "stop"], env=env, capture_output=True)
        slurm.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
