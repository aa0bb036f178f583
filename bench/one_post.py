#!/usr/bin/env python3
"""The one-POST request path (issue 18): what one `POST /jobs` of one job costs, server and client apart.

    python bench/one_post.py [--runs 3] [--posts 2000] [--backlog 0] [--strace]
    python bench/one_post.py --running [--runs 3] [--posts 1000]    # run.py's one-POST figure, split
    python bench/one_post.py --running --syncs [--reader 0.005]     # fdatasyncs per POST, a reader beside
    python bench/one_post.py --hogs 2 [--posts 1000]                # what the POSTs take from CPU-bound jobs
    cp bench/one_post.py OTHER/bench/ && python OTHER/bench/one_post.py    # another checkout, alternate

A throw-away cluster (bench/cluster.py: one local host of 2 slots) whose two slots hold `sleep`
jobs, so that what is submitted pends and nothing runs: only the request path is measured. With
--backlog N, N jobs are pending before the runs (one batch POST). Each run sends --posts POSTs of
one job each over one kept-alive connection, each with its own request id, as `xce submit` and
the Python API send them (Client.submit), and prints per POST: the client's CPU (this thread),
the controller's CPU (every thread's schedstat) split into its main thread (the tick a submit
wakes; not the request path) and its other threads (the API's serving thread and workers, and
the host links, idle here; the busiest of them apart: the API worker that lingers on the connection
and serves every POST, server.py), and the rate; the round trip (wall per POST) and how much of it
the API worker, the main thread and the client waited runnable for a CPU (schedstat's run-queue
wait, over the POSTs alone: with jobs beside, the largest piece of a round trip), and the round
trips' spread: median, p90, p99, and the POSTs that took over twice the median (how many, and their
share of the POSTs' wall: with jobs beside, those that met a tick, which holds the GIL and the
store's lock for ~2-5 ms; bench/README.md, session 22). CPU time is what
the machine's load moves least; quote `uptime` beside it. The API server's counters close the
figures: requests a lingering worker took itself (`kept`, server.py's linger) and connections
handed back to the serving thread. With
--strace, one more run under `strace -c -f` counts the controller's system calls per POST
(deterministic, unlike times; strace slows that run, its rate is not one).
With --running the slots are free and the `true` jobs run beside the POSTs (sent as run.py's
one-POST figure sends them: Client.post, no request id), each run waiting until all are done: it
prints the submit phase and first POST -> all done (wall), the same CPU split per job over the
whole run (the main thread: the ticks that dispatch and record the jobs), and the ticks and
scheduling sessions per job (the controller's metrics). --syncs counts the controller's fdatasync
calls per POST in each run (`perf stat` of the syscall's tracepoint: needs perf and root); --reader S
has a second client read the store (GET /jobs, as an `xce jobs` loop) every S seconds meanwhile.
--hogs N runs N CPU-bound processes (`while True: pass`, each in its own session as a job is) beside
the POSTs and prints the share of a CPU each got during them: what the request path takes from jobs
that want the CPU (a change to the API threads' scheduling must not lower it).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import BenchCluster, machine_busy_seconds, wait_done


def thread_cpu(pid: int, field: int = 0) -> dict[int, int]:
    """Nanoseconds on a CPU of each thread of `pid` alive now (schedstat's first field); `field=1`:
    nanoseconds each waited runnable for a CPU (its run-queue wait)."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                out[int(task)] = int(f.read().split()[field])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return out


def own_wait() -> int:
    """Nanoseconds this thread has waited runnable for a CPU."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1])


def settle(pid: int, quiet: float = 0.3, timeout: float = 30.0) -> None:
    """Until the controller has used no CPU for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last = sum(thread_cpu(pid).values())
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = sum(thread_cpu(pid).values())
        if now - last < 2_000_000:
            return
        last = now


def run_once(c: BenchCluster, spec: dict, posts: int, running: bool = False, syncs: bool = False,
             reader: float = 0.0, hogs: list[int] = ()) -> dict[str, float]:
    client = c.client()
    pid = c.pid
    counted = _ticks(client) if running else (0, 0)
    counter = _SyncCounter(pid) if syncs else None
    reading = _Reader(c, reader) if reader else None
    before, client0, wall0 = thread_cpu(pid), time.thread_time(), time.perf_counter()
    waits0, own0, hogs0 = thread_cpu(pid, 1), own_wait(), sum(sum(thread_cpu(h).values()) for h in hogs)
    machine0 = machine_busy_seconds()
    ids, each = [], []  # each POST's wall (s): the round trips' spread
    for _ in range(posts):
        began = time.perf_counter()
        if running:  # as run.py's one-POST figure: no request id
            ids.append(client.post("/jobs", {"jobs": [spec]})["ids"][0])
        else:
            client.submit({"jobs": [spec]})
        each.append(time.perf_counter() - began)
    wall, client_cpu = time.perf_counter() - wall0, time.thread_time() - client0
    own1, waits1 = own_wait(), thread_cpu(pid, 1)
    hogged = (sum(sum(thread_cpu(h).values()) for h in hogs) - hogs0) / 1e9 / wall / len(hogs) if hogs else 0.0
    done = wall
    if running:
        wait_done(client, ids, time.monotonic() + 300)
        done = time.perf_counter() - wall0
    after = thread_cpu(pid)
    machine = 1000 * (machine_busy_seconds() - machine0) / posts
    reads = reading.stop() if reading is not None else 0
    synced = counter.stop() / posts if counter is not None else 0.0
    used = {tid: after[tid] - before.get(tid, 0) for tid in after}
    main = used.get(pid, 0) / 1e6 / posts
    others = sum(v for tid, v in used.items() if tid != pid) / 1e6 / posts
    busiest = max((tid for tid in used if tid != pid), key=lambda tid: used[tid], default=pid)
    worker = used.get(busiest, 0) / 1e6 / posts
    # run-queue waits over the POSTs alone (the submit phase), not to all done
    worker_wait = (waits1.get(busiest, 0) - waits0.get(busiest, 0)) / 1e6 / posts
    main_wait = (waits1.get(pid, 0) - waits0.get(pid, 0)) / 1e6 / posts
    client_wait = (own1 - own0) / 1e6 / posts
    mine = 1000 * client_cpu / posts
    ticks = [(b - a) / posts for a, b in zip(counted, _ticks(client))] if running else [0.0, 0.0]
    each.sort()
    median = statistics.median(each)
    slow = [x for x in each if x > 2 * median]
    spread = {"p50": 1000 * median, "p90": 1000 * each[int(0.9 * posts)], "p99": 1000 * each[int(0.99 * posts)],
              "slow": 100 * len(slow) / posts, "slow_share": 100 * sum(slow) / sum(each)}
    return {**spread, "client": mine, "main": main, "api": others, "worker": worker, "request": others + mine,
            "rate": posts / wall, "submit": wall, "machine": machine, "done": done, "ticks": ticks[0],
            "sessions": ticks[1], "syncs": synced, "reads": reads, "worker_wait": worker_wait,
            "main_wait": main_wait, "client_wait": client_wait, "round": 1000 * wall / posts, "hogs": hogged}


class _SyncCounter:
    """The fdatasync calls of process `pid` from now to `stop` (perf stat of the syscall's tracepoint)."""

    def __init__(self, pid: int) -> None:
        self.out = Path(tempfile.mkdtemp(prefix="one-post-")) / "perf.txt"
        self.proc = subprocess.Popen(["perf", "stat", "-x,", "-e", "syscalls:sys_enter_fdatasync", "-p", str(pid),
                                      "-o", str(self.out)], stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # attached

    def stop(self) -> int:
        self.proc.send_signal(2)
        self.proc.wait()
        lines = [line for line in self.out.read_text().splitlines() if "fdatasync" in line]
        return int(lines[-1].split(",")[0]) if lines else 0


class _Reader:
    """A second client reading the store (GET /jobs) every `every` seconds until `stop`."""

    def __init__(self, c: BenchCluster, every: float) -> None:
        self.client, self.every, self.reads = c.new_client(), every, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(self.every):
            self.client.get("/jobs")
            self.reads += 1

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        self.client.close()
        return self.reads


def _ticks(client) -> tuple[int, int]:
    """Ticks and scheduling sessions the controller has run (its metrics' histogram counts)."""
    histograms = client.get("/metrics")["registry"]["histograms"]
    return histograms.get("tick", {}).get("count", 0), histograms.get("session", {}).get("count", 0)


def strace_counts(c: BenchCluster, spec: dict, posts: int) -> tuple[float, list[tuple[str, float]]]:
    client = c.client()
    with tempfile.TemporaryDirectory(prefix="one-post-") as tmp:
        out = Path(tmp) / "strace.txt"
        tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(c.pid), "-o", str(out)],
                                  stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # strace attaches to every thread
        for _ in range(posts):
            client.submit({"jobs": [spec]})
        time.sleep(0.5)
        tracer.send_signal(2)
        tracer.wait()
        calls, total = [], 0.0
        for line in out.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[-1] == "total":
                total = int(parts[3]) / posts
            elif len(parts) >= 5 and parts[3].isdigit():
                calls.append((parts[-1], int(parts[3]) / posts))
    return total, sorted(calls, key=lambda kv: -kv[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--posts", type=int, default=2000)
    parser.add_argument("--backlog", type=int, default=0, help="jobs pending before the runs")
    parser.add_argument("--strace", action="store_true", help="count the controller's system calls per POST")
    parser.add_argument("--running", action="store_true", help="free slots: the jobs run beside the POSTs")
    parser.add_argument("--syncs", action="store_true", help="count the controller's fdatasyncs per POST (perf)")
    parser.add_argument("--reader", type=float, default=0.0, help="a second client reads GET /jobs every S s")
    parser.add_argument("--hogs", type=int, default=0, help="N CPU-bound processes beside: the CPU share each got")
    args = parser.parse_args(argv)
    c = BenchCluster(slots=2)
    c.start()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(args.hogs)]
    try:
        client = c.client()
        if not args.running:
            client.post("/jobs", {"jobs": [c.spec(["sleep", "600"])] * 2})  # both slots busy: the rest pends
        spec = c.spec(["true"], name="post") if not args.running else c.spec(["true"])
        if args.backlog:
            client.post("/jobs", {"jobs": [spec] * args.backlog})
        warm = [client.submit({"jobs": [spec]})["ids"][0] for _ in range(200)]  # workers exist, spec admitted
        if args.running:
            wait_done(client, warm, time.monotonic() + 120)
        settle(c.pid)
        runs = []
        for run in range(args.runs):
            r = run_once(c, spec, args.posts, args.running, args.syncs, args.reader, [h.pid for h in hogs])
            runs.append(r)
            print(f"run {run + 1}: client {r['client']:.3f} + controller API/other threads {r['api']:.3f} = "
                  f"{r['request']:.3f} ms CPU per POST; controller main thread {r['main']:.3f} ms; "
                  f"{r['rate']:.0f} POSTs/s" + (f"; submit phase {r['submit']:.3f} s, all done {r['done']:.3f} s, "
                                                 f"{r['ticks']:.2f} ticks, {r['sessions']:.2f} sessions per job"
                                                 if args.running else "")
                  + (f"; {r['syncs']:.2f} fdatasyncs per POST" if args.syncs else "")
                  + (f"; {r['reads']} reads beside" if args.reader else ""), flush=True)
            settle(c.pid)
        load = os.getloadavg()
        kind = "jobs run beside, to all done" if args.running else "request ids"
        print(f"\n{args.runs} runs of {args.posts} one-job POSTs ({kind}), {args.backlog} pending before; "
              f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; medians (min-max)")
        rows = [("client", "client CPU ms/POST"), ("api", "controller API+other threads CPU ms/POST"),
                ("worker", "  of which the busiest (the API worker)"),
                ("request", "request path CPU ms/POST (the two above)"),
                ("main", "controller main thread CPU ms/POST"), ("machine", "machine CPU ms/POST (all of /proc/stat)"),
                ("rate", "POSTs/s"), ("round", "round trip ms (wall per POST)"),
                ("p50", "  round trip median ms"), ("p90", "  round trip p90 ms"), ("p99", "  round trip p99 ms"),
                ("slow", "  POSTs over twice the median, %"),
                ("slow_share", "  their share of the POSTs' wall, %"),
                ("worker_wait", "  the API worker's run-queue wait ms/POST"),
                ("main_wait", "  the main thread's run-queue wait ms/POST"),
                ("client_wait", "  the client's run-queue wait ms/POST")]
        if args.syncs:
            rows.append(("syncs", "controller fdatasyncs per POST"))
        if hogs:
            rows.append(("hogs", f"CPU share of each of the {len(hogs)} hogs"))
        if args.running:
            rows += [("submit", "submit phase s"), ("done", "first POST -> all done s"),
                     ("ticks", "ticks per job"), ("sessions", "sessions per job")]
        for key, label in rows:
            values = [r[key] for r in runs]
            print(f"  {label:44s} {statistics.median(values):8.3f} ({min(values):.3f}-{max(values):.3f})")
        api = client.get("/status")["api"]
        print(f"  API server: {api.get('kept', '-')} requests kept by the worker that answered the one before "
              f"(linger), {api['handed_back']} handed back, {api['threads']} worker threads")
        if args.strace:
            total, calls = strace_counts(c, spec, min(args.posts, 500))
            print(f"  controller system calls per POST {total:.1f}: "
                  + ", ".join(f"{name} {n:.1f}" for name, n in calls if n >= 0.5))
    finally:
        for hog in hogs:  # ours, by PID
            hog.kill()
            hog.wait()
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
