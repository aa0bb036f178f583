"""Simulator benchmark: 100,000 jobs on 1,000 hosts through `xce sim`'s engine (the controller's own
tick, sim/ticked.py), trace off and on.

    python bench/sim.py                    # the goal size, 3 runs trace off + 1 run with a traced subset
    python bench/sim.py --jobs 20000       # a smaller size (minutes, not a quarter of an hour)
    python bench/sim.py --runs 5 --traced 100
    python bench/sim.py --jobs 20000 --runs 1 --traced 0 --profile 15   # where the time goes

Prints figures and asserts nothing. The cluster and workload are synthetic, from a fixed seed, and
written as the files a user would give (`xce.yaml`, a CSV workload) into a temporary directory:
1,000 hosts (900 with 16 slots and 64G, 100 GPU hosts with 32 slots, 256G and 4 GPUs), three queues
(normal; short, with a 1h run limit; gpu on the GPU hosts with a per-user running limit), and jobs
of five shapes (serial with mem; 4 tasks on one host, some beyond the short queue's run limit, which
end EXIT; 16-48 task parallel jobs with span[ptile=16]; a task range 1..8; GPU jobs) submitted in
bursts by 50 users at whole seconds, offering 85% of the cluster's slot-seconds.

Figures (medians of --runs runs, with min and max):
  1. loading the 100,000-job workload (CSV parse, validation);
  2. the whole run, trace off: wall and CPU time, steps, sessions, simulated seconds per wall second,
     and a hash of every recorded step (runs must agree);
  3. the same run with `--traced` jobs traced at full level (rendered as the REPL does): its wall
     time against 2, and the decisions' hash, which must equal trace off's;
  4. with --profile N: one more run under cProfile, its N costliest functions by cumulative and by
     own time.
Goals: the whole 100,000-job run in under 2 minutes on this machine, trace off; at most 1.5x the
core-only engine's time (the tree before it went: run this file there, same hour).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # measure the tree this file is in, not whatever is installed

from xce_lite.sim import trace
from xce_lite.sim.record import canonical
from xce_lite.sim.ticked import TickSimulation
from xce_lite.sim.workload import load_workload

SEED = 20261201
CONFIG = """cluster: bench
hosts:
{hosts}
queues:
  - {{name: normal, priority: 30, default: true}}
  - {{name: short, priority: 50, run_limit: 1h}}
  - {{name: gpu, priority: 60, hosts: [{gpu_hosts}], user_running_limit: 16}}
controller: {{tick: 1s, reserve_after: 1h}}
"""


def write_inputs(folder: Path, n_jobs: int, n_hosts: int) -> tuple[Path, Path]:
    gpu = n_hosts // 10
    hosts = [f"  - {{name: c{i:04d}, slots: 16, mem: 64G}}" for i in range(n_hosts - gpu)]
    hosts += [f"  - {{name: g{i:03d}, slots: 32, mem: 256G, gpus: 4}}" for i in range(gpu)]
    config = folder / "xce.yaml"
    config.write_text(CONFIG.format(hosts="\n".join(hosts), gpu_hosts=", ".join(f"g{i:03d}" for i in range(gpu))))
    rng = random.Random(SEED)
    slots = (n_hosts - gpu) * 16 + gpu * 32
    rows = []
    while len(rows) < n_jobs:
        kind = rng.random()
        if kind < 0.60:
            row = {"queue": "normal", "n": "1", "R": f"rusage[mem={rng.choice((1, 2, 4))}G]",
                   "runtime": rng.choice((300, 900, 1800, 3600, 7200))}
        elif kind < 0.82:
            row = {"queue": "short", "n": "4", "R": "span[hosts=1] rusage[mem=1G]",
                   "runtime": rng.choice((120, 600, 1800, 4000))}  # 4000 > the 1h limit: EXIT
        elif kind < 0.86:
            row = {"queue": "normal", "n": str(rng.choice((16, 32, 48))), "R": "span[ptile=16]",
                   "runtime": rng.choice((1800, 3600))}
        elif kind < 0.97:
            row = {"queue": "normal", "n": "1,8", "R": "rusage[mem=512M]", "runtime": rng.choice((600, 1200))}
        else:
            row = {"queue": "gpu", "n": "1", "R": "rusage[gpus=1, mem=8G]", "runtime": rng.choice((600, 1800, 3600))}
        rows.append(row)
    # Offer 85% of the cluster's slot-seconds: a busy cluster with a backlog that comes and goes.
    # (A task range 1..8 is counted at 4 tasks; the short queue's limit caps a 4000 s run at 3600.)
    mean = sum(min(r["runtime"], 3600 if r["queue"] == "short" else 1e9) * (4 if r["n"] == "1,8" else int(r["n"]))
               for r in rows) / len(rows)
    per_second = slots * 0.85 / mean
    t, i = 0, 0
    while i < len(rows):  # bursts of 1-40 jobs by one user at whole seconds
        burst = min(rng.randint(1, 40), len(rows) - i)
        t += max(1, round(rng.expovariate(per_second / burst)))
        user = f"u{rng.randrange(50):02d}"
        for row in rows[i:i + burst]:
            row.update(submit=t, user=user)
        i += burst
    workload = folder / "workload.csv"
    with workload.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["submit", "user", "queue", "n", "R", "runtime"])
        writer.writeheader()
        writer.writerows(rows)
    return config, workload


def run_once(config: Path, workload: Path, traced: frozenset[int] | None, interval: float | None) -> dict:
    t0 = time.perf_counter()
    load = load_workload(workload)
    t1, c1 = time.perf_counter(), time.process_time()
    sim = TickSimulation(config, load, interval)
    try:
        digest = hashlib.sha256()
        lines = 0
        wants = traced.__contains__ if traced is not None else None
        while (step := sim.step(wants)) is not None:
            digest.update(canonical(step.to_json()).encode())
            for examined in step.examined:
                lines += len(trace.render(examined, step.number, step.time, step.session, trace.FULL))
        t2, c2 = time.perf_counter(), time.process_time()
        states: dict[str, int] = {}
        for outcome in sim.outcomes():
            states[outcome.state] = states.get(outcome.state, 0) + 1
        return {"load": t1 - t0, "run": t2 - t1, "cpu": c2 - c1, "steps": sim.steps, "sessions": sim.sessions,
                "simulated": sim.now, "hash": digest.hexdigest()[:16], "trace_lines": lines, "states": states,
                "rejected": len(sim.rejected)}
    finally:
        sim.close()


def profile(config: Path, workload: Path, interval: float | None, top: int) -> None:
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    run_once(config, workload, None, interval)
    profiler.disable()
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(top)
        body = out.getvalue()
        print(f"  4 cProfile, top {top} by {key}:")
        print("\n".join("    " + line for line in body[body.index("ncalls"):].rstrip().splitlines()))


def stats(values: list[float]) -> str:
    return (f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f}, "
            f"{len(values)} runs)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--traced", type=int, default=50, help="jobs traced at full level in figure 3 (0: skip it)")
    ap.add_argument("--interval", type=float, default=None, help="seconds between scheduling instants "
                    "(default: the config's controller.tick, 1 s)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="one more run under cProfile: print its "
                    "N costliest functions")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, xce_lite from {ROOT / 'xce_lite'}, seed {SEED}; engine: the "
          f"controller's tick")
    with tempfile.TemporaryDirectory() as tmp:
        config, workload = write_inputs(Path(tmp), args.jobs, args.hosts)
        print(f"input: {args.hosts} hosts, {args.jobs} jobs ({workload.stat().st_size / 1e6:.1f} MB of CSV)")
        runs = [run_once(config, workload, None, args.interval) for _ in range(args.runs)]
        first = runs[0]
        assert all(r["hash"] == first["hash"] for r in runs), "runs differ: the simulator is not deterministic"
        print(f"  1 load workload: {stats([r['load'] for r in runs])}")
        wall = [r["run"] for r in runs]
        print(f"  2 run, trace off:          {stats(wall)}  goal < 120 s: "
              f"{'met' if statistics.median(wall) < 120 else 'MISSED'}")
        print(f"    CPU time of this process: {stats([r['cpu'] for r in runs])} (the machine is shared: wall "
              f"time includes waiting for a core)")
        print(f"    {first['steps']} steps, {first['sessions']} sessions, simulated {first['simulated']:.0f} s = "
              f"{first['simulated'] / statistics.median(wall):.0f} simulated s per wall s; jobs: {first['states']}, "
              f"{first['rejected']} rejected; decisions hash {first['hash']}")
        if args.traced:
            rng = random.Random(SEED)
            traced = frozenset(rng.sample(range(1, args.jobs + 1), args.traced))
            t = run_once(config, workload, traced, args.interval)
            base = statistics.median(wall)
            change = 100 * (t["run"] - base) / base
            print(f"  3 run, {args.traced} jobs traced at full level: {t['run']:.2f} s ({change:+.1f}% "
                  f"against trace off), {t['trace_lines']} trace lines; decisions hash {t['hash']} "
                  f"({'identical' if t['hash'] == first['hash'] else 'DIFFERENT'})")
        if args.profile:
            profile(config, workload, args.interval, args.profile)


if __name__ == "__main__":
    main()
