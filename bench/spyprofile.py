#!/usr/bin/env python3
"""Where xce_lite spends a 1000-job run: py-spy samples of the controller and its host agent.

    python bench/spyprofile.py [--jobs 1000] [--one-each] [--busy] [--py-spy PATH] [--keep DIR]

Starts a throw-away controller (as bench/run.py does), warms it, then samples the controller
(every thread, idle included, so waits show; with --busy only the samples py-spy finds on a CPU or
in a system call: an fdatasync's wait counts) and the host agent with `py-spy record --format raw`
while N `true` jobs run to completion, and prints, per thread, the functions that hold the most
wall time (inclusive: the function or anything it called). py-spy is not a dependency of the
project: install it apart, e.g. `python -m venv /tmp/bench-spy-venv && /tmp/bench-spy-venv/bin/pip
install py-spy`. With --keep DIR the raw stacks are kept (feed them to flamegraph.pl or speedscope).
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster, is_agent, wait_done

FRAME = re.compile(r"^(?P<func>.*?) \((?P<where>[^()]*)\)$")


def find_py_spy(given: str | None) -> str | None:
    for candidate in (given, "/tmp/bench-spy-venv/bin/py-spy", shutil.which("py-spy")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def analyse(path: Path, top: int, title: str) -> None:
    """Inclusive samples per (thread, function) from py-spy's raw (collapsed) stacks."""
    per_thread: Counter[str] = Counter()
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    leaf: dict[str, Counter[str]] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread = "main"
        if frames[0].startswith("thread ("):  # "thread (TID): NAME" with --threads, "thread (TID)" else
            head = frames.pop(0)
            thread = head.partition("): ")[2] or "main"
        thread = re.sub(r"^Thread-\d+ ", "", thread)  # Thread-5 (process_request_thread): one name
        per_thread[thread] += n
        seen = set()
        for frame in frames:
            m = FRAME.match(frame)
            name = f"{m['func']} ({m['where'].rsplit('/', 2)[-1] if m else ''})" if m else frame
            name = re.sub(r":\d+\)$", ")", name)
            if name not in seen:
                inclusive[thread][name] += n
                seen.add(name)
        if frames:
            m = FRAME.match(frames[-1])
            leaf[thread][f"{m['func']} ({m['where'].rsplit('/', 2)[-1]})" if m else frames[-1]] += n
    print(f"\n== {title}: samples per thread")
    for thread, n in per_thread.most_common():
        print(f"  {n:7d}  {thread}")
    shown = [t for t in per_thread if t in ("MainThread", "main", "(process_request_thread)", "agent-local")
             or t.startswith("api-worker")]  # the API's worker threads: a POST's path
    for thread in shown or [t for t, _ in per_thread.most_common(3)]:
        n = per_thread[thread]
        print(f"\n  -- {thread}: top {top} functions by inclusive share of this thread's samples "
              "(frames on every sample left out)")
        ranked = [(name, k) for name, k in inclusive[thread].most_common() if k < 0.995 * n]
        for name, k in ranked[:top]:
            print(f"    {100 * k / n:5.1f}%  {name}")
        print(f"  -- {thread}: top 8 leaf lines (where the samples were taken)")
        for name, k in leaf[thread].most_common(8):
            print(f"    {100 * k / n:5.1f}%  {name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--one-each", action="store_true", help="one POST per job instead of one batch")
    ap.add_argument("--py-spy", help="path to py-spy (default: /tmp/bench-spy-venv/bin/py-spy, then PATH)")
    ap.add_argument("--rate", type=int, default=200, help="samples per second (default 200)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--keep", help="keep the raw stacks in this directory")
    ap.add_argument("--busy", action="store_true",
                    help="py-spy without --idle: samples on a CPU or in a system call (an fdatasync's wait counts)")
    args = ap.parse_args()
    spy = find_py_spy(args.py_spy)
    if spy is None:
        print("py-spy not found: pip install py-spy into a separate venv, or pass --py-spy PATH")
        return 1
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="xbprof-", dir="/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    c = BenchCluster(slots=2)
    spies: list[subprocess.Popen] = []
    try:
        c.start()
        client = c.client()
        spec = c.spec(["true"])
        wait_done(client, client.post("/jobs", {"jobs": [spec] * 20})["ids"], time.monotonic() + 60)
        time.sleep(0.5)
        agents = [p.pid for p in c.descendants() if is_agent(p.cmdline())]
        targets = [("controller", c.pid)] + [("agent", pid) for pid in agents[:1]]
        for name, pid in targets:
            spies.append(subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--rate", str(args.rate), "--format", "raw", "--threads",
                 *([] if args.busy else ["--idle"]), "--nonblocking", "-o", str(out / f"{name}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        time.sleep(1.0)  # py-spy attaches
        t0 = time.perf_counter()
        if args.one_each:
            ids = [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(args.jobs)]
        else:
            ids = client.post("/jobs", {"jobs": [spec] * args.jobs})["ids"]
        wait_done(client, ids, time.monotonic() + 300)
        wall = time.perf_counter() - t0
        for p in spies:
            p.send_signal(signal.SIGINT)
        for p in spies:
            p.wait(60)
        print(f"{args.jobs} jobs ({'one POST each' if args.one_each else 'one batch'}): {wall:.2f} s, "
              f"{args.jobs / wall:.0f} jobs/s (under py-spy at {args.rate} Hz; the sampled run also holds "
              f"~1 s before and after the jobs)")
        for name, _pid in targets:
            analyse(out / f"{name}.txt", args.top, name)
    finally:
        for p in spies:
            if p.poll() is None:
                p.kill()
        c.stop()
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
