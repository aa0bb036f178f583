#!/usr/bin/env python3
"""Workflow benchmark: accepting a 10,000-element array, what it stores, the scheduling with it
pending, and validating and submitting a 1,000-step flow.

    python bench/workflows.py              # every figure, 5 runs each: about a minute here
    python bench/workflows.py --runs 9 --size 10000 --steps 1000

Prints figures (median, min, max of the runs) and asserts nothing. See bench/README.md.

  1. accept: one POST /jobs of one array spec of --size elements, through a real controller (the
     spec carries a copy of this environment, as `xce submit` sends it); goal: under 1 s. For scale,
     the same number of plain jobs in one POST (each with its own copy of the spec).
  2. store: the growth of the job store (pages * page size, read through SQLite) per array and per
     element, against the spec's size times the element count (what copying it would cost).
  3. schedule: one session of the pure core with the array's elements pending as the controller
     feeds them (one shape: they share their merge), on 50 hosts with no free slot and on 50 hosts
     with 4 free slots each; with a throttle %10 the controller feeds only 10 of them, and its gate
     decides for the others: gate.decide over --size throttled elements, the cost per tick.
  4. flow: flow.load (the whole-document check) of a --steps step flow (one first step, the rest
     fanning out after it, and a last step after all of them), then POST /flows of its specs (the
     controller's checks, resolution and the one transaction), then `xce flow submit` as a user
     runs it (process start, YAML, check, POST).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # measure the tree this file is in, not whatever is installed

from cluster import BenchCluster

from xce_lite.config.sched_view import job_request
from xce_lite.models import JobSpec
from xce_lite.sched import core
from xce_lite.sched.placement import GPUS, SLOTS, HostView
from xce_lite.workflow import deps, deps_eval, flow
from xce_lite.workflow.gate import Gate, Waiter

G = 1024**3


def figure(name: str, samples: list[float], unit: str = "s", goal: str = "") -> None:
    med = statistics.median(samples)
    scale, label = (1000.0, "ms") if unit == "s" and med < 1 else (1.0, unit)
    print(f"  {name:<62} median {med * scale:9.2f} {label}   min {min(samples) * scale:9.2f}   "
          f"max {max(samples) * scale:9.2f}   runs {len(samples)}" + (f"   goal {goal}" if goal else ""))


def store_bytes(path: Path) -> int:
    import apsw

    con = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return con.execute("PRAGMA page_count").get * con.execute("PRAGMA page_size").get
    finally:
        con.close()


def bench_accept_and_store(runs: int, size: int) -> None:
    print(f"1-2. accepting a {size:,}-element array through a real controller, and what it stores")
    c = BenchCluster(slots=2)
    try:
        c.start()
        client = c.client()
        sleeper = c.spec(["sleep", "600"])
        client.post("/jobs", {"jobs": [sleeper, sleeper]})  # both slots busy: the elements pend
        spec = dict(c.spec(["true"]), env=dict(os.environ), name="sweep", array=f"[1-{size}]")
        accept, growth = [], []
        for _ in range(runs):
            before = store_bytes(c.home / "xce.db")
            start = time.perf_counter()
            client.post("/jobs", {"jobs": [spec]})
            accept.append(time.perf_counter() - start)
            growth.append(store_bytes(c.home / "xce.db") - before)
        figure(f"POST of one {size:,}-element array: accepted, on disk", accept, goal="< 1 s")
        plain = dict(spec, array=None)
        start = time.perf_counter()
        client.post("/jobs", {"jobs": [plain] * size})
        figure(f"for scale: {size:,} plain jobs in one POST", [time.perf_counter() - start])
        med = statistics.median(growth)
        spec_bytes = len(JobSpec.from_wire({k: v for k, v in spec.items() if v is not None}).to_json())
        print(f"  store growth per array: median {med / 1e6:.2f} MB ({med / size:.0f} bytes per element: its job "
              f"row, its submitted event, their indexes); the spec with its environment is {spec_bytes:,} bytes, "
              f"stored once ({spec_bytes * size / 1e6:.1f} MB if every element copied it)")
        client.post("/jobs/kill", {"ids": [1, 2]})
    finally:
        c.stop()


def bench_schedule(runs: int, size: int) -> None:
    print(f"3. scheduling with the {size:,} elements pending (the pure core, as the controller feeds it)")
    elements = tuple(core.PendingJob(i, "alice", "normal", job_request(i, 1, None, ()), 0, float(i))
                     for i in range(1, size + 1))

    def hosts(free: int) -> tuple[HostView, ...]:
        return tuple(HostView(f"h{i}", "ok", {SLOTS: 4, "mem": 64 * G, GPUS: 0},
                              {SLOTS: free, "mem": 64 * G, GPUS: 0}, (), {}, frozenset()) for i in range(50))

    queues = (core.QueuePolicy("normal"),)
    for label, free in (("50 hosts, no free slot", 0), ("50 hosts, 4 free slots each", 4)):
        samples = []
        for _ in range(runs):
            snapshot = core.Snapshot(hosts(free), elements, queues)
            start = time.perf_counter()
            decisions = core.schedule(snapshot)
            samples.append(time.perf_counter() - start)
        figure(f"schedule(): {size:,} pending, {label} ({len(decisions.dispatches)} dispatched)", samples)
    throttled = core.Snapshot(hosts(4), elements[:10], queues)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        core.schedule(throttled)
        samples.append(time.perf_counter() - start)
    figure("schedule(): the same array with %10: the 10 elements fed", samples)
    samples = []
    for _ in range(runs):
        gate = Gate()
        shared = deps.resolve(deps.parse("done(1)"), lambda ref: [deps.Target(1)])
        for i in range(2, size + 2):
            gate.add(Waiter(i, shared, array_id=2, throttle=10))
        done = deps_eval.group_facts([("DONE", 0, True)])
        start = time.perf_counter()
        decision = gate.decide(lambda _t, facts=done: facts, {2: 5})
        samples.append(time.perf_counter() - start)
    figure(f"gate.decide(): {size:,} throttled elements with a dependency ({len(decision.feed)} fed)", samples)


def flow_document(steps: int) -> dict:
    rng = random.Random(7)
    middle = {f"s{i}": {"command": ["true"], "after": ["first"], "run_limit": f"{rng.randint(1, 60)}m"}
              for i in range(steps - 2)}
    return {"name": "big", "steps": {"first": {"command": ["sleep", "600"]}, **middle,
                                     "last": {"command": ["true"], "after": list(middle)}}}


def bench_flow(runs: int, steps: int) -> None:
    import yaml

    from xce_lite.cli.flow import _spec

    print(f"4. a {steps:,}-step flow: validate, then submit")
    document = flow_document(steps)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        loaded = flow.load(document)
        samples.append(time.perf_counter() - start)
    figure(f"flow.load(): the whole {steps:,}-step document checked and ordered", samples)
    c = BenchCluster(slots=2)
    try:
        c.start()
        client = c.client()
        base = Path(c.work)
        body = {"name": "big", "steps": [{"step": s.name, "spec": _spec(s, base)} for s in loaded.steps]}
        post = []
        for _ in range(runs):
            start = time.perf_counter()
            reply = client.post("/flows", body)
            post.append(time.perf_counter() - start)
            client.post("/jobs/kill", {"ids": [reply["steps"][0]["id"]]})  # its dependants are cancelled
        figure(f"POST /flows of {steps:,} steps: checked, resolved, stored in one transaction", post)
        path = Path(tempfile.mkdtemp(prefix="xbf-")) / "big.yaml"
        path.write_text(yaml.safe_dump(document))
        cli = []
        for _ in range(runs):
            start = time.perf_counter()
            result = c.xce("flow", "submit", str(path), timeout=300)
            cli.append(time.perf_counter() - start)
            if result.returncode != 0:
                raise RuntimeError(result.stderr)
            first = int(result.stdout.split("first <")[1].split(">")[0])
            client.post("/jobs/kill", {"ids": [first]})
        figure(f"`xce flow submit` of the {steps:,}-step file, as a user runs it", cli)
        shutil.rmtree(path.parent)  # with the outputs of the flows' killed jobs
    finally:
        c.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", type=int, default=10_000, help="elements of the array")
    parser.add_argument("--steps", type=int, default=1000, help="steps of the flow")
    parser.add_argument("--only", default="accept,schedule,flow")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(f"xce_lite workflows bench: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    if "accept" in only:
        bench_accept_and_store(args.runs, args.size)
    if "schedule" in only:
        bench_schedule(args.runs, args.size)
    if "flow" in only:
        bench_flow(args.runs, args.steps)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.TimeoutExpired as err:
        print(f"timed out: {err}", file=sys.stderr)
        sys.exit(1)
