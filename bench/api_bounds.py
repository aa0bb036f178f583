"""What the API costs the controller: fds, threads and RSS before and after 300 `xce jobs`, and
with 1,000 idle connections open. Prints figures; asserts nothing.

    python bench/api_bounds.py [--reads 300] [--idle 1000]

Each read is a real `xce jobs -a` process (one connection each, as users make them). The idle
connections are opened by this process and never send a byte. Figures are read from
/proc/PID/fd, /proc/PID/task and /proc/PID/status of the controller (VmRSS).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import BenchCluster, proc_status


def sample(pid: int) -> tuple[int, int, float]:
    return (len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task")),
            proc_status(pid)["VmRSS"] / 1e6)


def show(label: str, figures: tuple[int, int, float]) -> None:
    fds, threads, rss = figures
    print(f"  {label:<34} fds {fds:5d}   threads {threads:5d}   VmRSS {rss:6.1f} MB", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--idle", type=int, default=1000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.idle + 200 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.idle + 200, hard))
    bench = BenchCluster()
    try:
        bench.start()
        bench.client().post("/jobs", {"jobs": [bench.spec(["true"])]})
        time.sleep(2.0)  # the job ran, the controller settled: the baseline
        pid = bench.pid
        print(f"controller pid {pid}")
        show("start", sample(pid))
        t0 = time.monotonic()
        for _ in range(args.reads):
            result = bench.xce("jobs", "-a")
            if result.returncode != 0:
                print(f"  xce jobs failed: {result.stderr.strip()}")
                return 1
        show(f"after {args.reads} `xce jobs -a`", sample(pid))
        print(f"  ({args.reads} reads in {time.monotonic() - t0:.1f} s)")
        idle = []
        for _ in range(args.idle):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(bench.socket))
            idle.append(sock)
        time.sleep(1.0)
        show(f"with {args.idle} idle connections", sample(pid))
        t0 = time.monotonic()
        answered = bench.xce("jobs", "-a")
        print(f"  `xce jobs -a` meanwhile: exit {answered.returncode} in {time.monotonic() - t0:.2f} s")
        for sock in idle:
            sock.close()
        time.sleep(1.0)
        show("after closing them", sample(pid))
    finally:
        bench.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
