"""What owning the job's whole tree costs a plain supervisor (exec/agent/tree.py).

    python bench/tree.py [--runs 200] [--leftovers 20]

Prints, each as the median (and min) of --runs samples in this process:

- `sweep, no leftover`: stop_leftovers() in a process with no child, which is what every job that
  leaves nothing behind pays once it has ended (a waitid, no walk of /proc);
- `walk of /proc`: one descendants() walk, with the number of processes it read: what a sweep
  pays per round when something is left, and what the memory sample pays every 0.5 s;
- `sweep of N leftovers`: a shell starts N `sleep 1000` in the background (in its process group,
  and half of them in sessions of their own with setsid) and exits; the time from its end to every
  sleep killed and reaped, once, with this process a subreaper as a supervisor is;
- `prctl through ctypes`: load_prctl() in a fresh interpreter (the import of ctypes and the
  lookup of libc's prctl), which an agent pays once, not per job.

Asserts nothing; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's xce_lite

from xce_lite.exec.agent import tree
from xce_lite.exec.agent.signals import SUPERVISOR_SIGNALS, signal


def reap() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def timed(fn, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return samples


def show(label: str, samples: list[float], extra: str = "") -> None:
    print(f"{label:<32} median {statistics.median(samples) * 1e6:9.0f} us   min {min(samples) * 1e6:9.0f} us{extra}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--leftovers", type=int, default=20)
    args = parser.parse_args()
    signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)  # as in a supervisor: SIGCHLD is taken
    show("sweep, no leftover", timed(lambda: tree.stop_leftovers(1.0, reap), args.runs))
    count = sum(1 for name in os.listdir("/proc") if name.isdigit())
    show("walk of /proc", timed(lambda: tree.descendants(os.getpid()), args.runs), f"   ({count} processes)")
    if not tree.become_subreaper():
        print("this kernel refuses PR_SET_CHILD_SUBREAPER: no sweep figure")
        return 0
    n, half = args.leftovers, args.leftovers // 2
    script = " ".join(["sleep 1000 &"] * (n - half) + ["setsid sleep 1000 &"] * half) + " exit 0"
    samples = []
    for _ in range(max(1, args.runs // 20)):
        # spawned as a supervisor spawns a job: with no signal blocked (a blocked TERM would be inherited)
        shell = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", script], os.environ, setsigmask=())
        os.waitpid(shell, 0)
        deadline = time.monotonic() + 30
        while len(tree.descendants(os.getpid())) < n:  # every sleep started (setsid execs late)
            if time.monotonic() > deadline:
                tree.stop_leftovers(0.0, reap)
                raise SystemExit("the shell did not start its sleeps within 30 s")
            time.sleep(0.001)
        began = time.perf_counter()
        killed = tree.stop_leftovers(5.0, reap)
        samples.append(time.perf_counter() - began)
        assert killed == n, killed
    show(f"sweep of {n} leftovers", samples)
    starts = []
    for _ in range(10):
        code = "import time; from xce_lite.exec.agent import tree; t = time.perf_counter(); tree.load_prctl(); " \
               "print(time.perf_counter() - t)"
        out = subprocess.run([sys.executable, "-S", "-E", "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])}).stdout
        starts.append(float(out))
    show("prctl through ctypes", starts, "   (once per agent)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
