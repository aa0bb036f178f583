#!/usr/bin/env python3
"""Time each step of the controller's tick during a 1000-job run, and try what-if fixes.

    python bench/ticktime.py [--jobs 1000] [--one-each | --array] [--what-if NAME[,NAME...]] [--depth N]
    python bench/ticktime.py --jobs 10000 --measure 300    # throughput with a 10k backlog
    python bench/ticktime.py --jobs 10000 --measure 200 --behind-sleepers   # as bench/run.py's backlog figure
    python bench/ticktime.py --jobs 10000 --measure 200 --behind-sleepers --trace 60   # + the kill's first steps
    python bench/ticktime.py --jobs 1000 --profile 40 [--profile-keep F]   # + cProfile of the ticks (thread CPU)

With --behind-sleepers it also prints, from the store's stamps, when things happened after the kill's
POST (the sleepers' units ended, the first backlog job finished; tick_readings.timeline); --trace N
lists the first N timed steps after the kill with their start times (which tick held up what);
without --behind-sleepers, after the submit (a run's first ticks: `--array --trace 60`).

The controller runs as its own process, exactly as `xce controller start --foreground` runs it
(`run_foreground`), but started through this file so that timers can be wrapped around its methods
IN THAT PROCESS ONLY (nothing in the source tree is changed). At its stop it writes, per step:
calls, total seconds, mean ms per call. The driver prints them against the run's wall time.

What-ifs (monkeypatches inside the timed controller; they measure a proposed fix, they are not one):
  normal    the writer connection uses PRAGMA synchronous=NORMAL instead of FULL
  inproc    the scheduler runs in the controller's thread instead of the forkserver pool
  worker    every session in the worker process, whatever its size (as before sched_switch.py)
  asyncforget  host.forget() is handed to a background thread instead of blocking the tick
  lean      inproc, and the scheduling session is skipped when no host has a free slot
  shmspool  the home's spool/ is a symlink to a directory on /dev/shm (tmpfs): unit directories and
            their files are created and removed there instead of on the disk's file system
  groupcommit  synchronous=FULL kept, but ONE commit per tick: every write of the tick (its record,
            the leases' grants, a declined dispatch's event) shares one transaction, committed just
            before the leases are sent and the units launched (intent before acting). Today's tick
            records starts, finishes, requeues and dispatches in one commit already (record_tick)
  budget    xce.yaml's controller.sched_budget set to 64 (jobs examined per session), so a session
            costs O(free slots) instead of O(pending) in the scheduler (the snapshot is still full)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from tick_profile import print_profile, profile_ticks, time_gc
from tick_counts import count_shortcuts
from tick_readings import backlog_behind_sleepers, count_reasons, cpu_split, critical_path, print_trace, timeline

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

WHAT_IFS = ("normal", "inproc", "worker", "asyncforget", "lean", "budget", "shmspool", "groupcommit")

_stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # calls, wall s, the thread's CPU s
_stats_lock = threading.Lock()
_trace: list[tuple[str, float, float, float]] = []  # --trace: (step, time.time() at its start, wall s, CPU s)
_trace_left = [0]  # steps still to trace, from the sleepers' kill (SIGUSR1)


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            dt, dc = time.perf_counter() - t0, time.thread_time() - c0
            with _stats_lock:
                entry = _stats[name]
                entry[0] += 1
                entry[1] += dt
                entry[2] += dc
                if _trace_left[0] > 0:
                    _trace_left[0] -= 1
                    _trace.append((name, time.time() - dt, dt, dc))
    return wrapper


def _instrument(what_if: set[str]) -> None:
    from xce_lite.controller import core as ctl
    from xce_lite.controller import dispatching, gating, leasework, prefilling, sched_worker, unitwork
    from xce_lite.exec import agentops
    from xce_lite.store import db, jobs

    # Only what exists: the source is being changed in parallel, a renamed step is skipped, not fatal.
    # JobStore._write's calls are the store's transactions (its time means nothing: it opens one).
    try:  # the seam that picks a session's side (absent from trees before it)
        from xce_lite.controller import sched_switch
        switching = [(sched_switch.SwitchingScheduler, "SwitchingScheduler", ("send", "receive")),
                     (sched_worker.InlineScheduler, "InlineScheduler", ("send", "receive"))]
    except ImportError:
        sched_switch, switching = None, []
    for cls, label, meths in (
            (ctl.Controller, "Controller", ("tick", "_schedule", "_hosts_now")),
            (sched_worker.SchedulerProcess, "SchedulerProcess", ("send", "receive")),
            *switching,
            (unitwork.Units, "Units", ("collect", "expire_lost_hosts", "act", "_launch")),
            (gating.Gating, "Gating", ("step",)),
            (leasework.HostLeases, "HostLeases", ("renew",)),
            (dispatching.Dispatching, "Dispatching", ("plans", "reasons_to_store", "apply")),
            (prefilling.Prefill, "Prefill", ("hidden", "extend", "withdraw")),
            (jobs.JobStore, "JobStore", ("submit", "finish", "dispatch", "started", "set_pend_reasons", "jobs",
                                         "record_tick", "set_host_leases", "record_event", "set_meta", "_write")),
            (agentops.AgentOps, "host", ("launch", "launch_nowait", "forget"))):
        for meth in meths:
            fn = getattr(cls, meth, None)
            if fn is None:
                print(f"ticktime: {label}.{meth} no longer exists; not timed", file=sys.stderr)
                continue
            name = f"host.{meth} (agent: sent, or a round trip)" if label == "host" else f"{label}.{meth}"
            setattr(cls, meth, _timed(name, fn))

    count_reasons(jobs.JobStore, _stats, _stats_lock)
    count_shortcuts(sched_worker, jobs, _stats, _stats_lock)
    if "normal" in what_if:
        real_connect = db.connect

        def connect(path, create=True, readonly=False):
            con = real_connect(path, create, readonly)
            if not readonly:
                con.execute("PRAGMA synchronous=NORMAL")
            return con

        db.connect = connect
        jobs.connect = connect
    if "inproc" in what_if or "lean" in what_if:
        # the controller's scheduler seam (seams._real_scheduler) takes SchedulerProcess from
        # sched_worker when it is called: the in-process one, timed, in its place
        from xce_lite.controller import sched_worker

        class Inline(sched_worker.InlineScheduler):
            def __init__(self, timeout: float = 60.0, shortcut: bool = True):  # SchedulerProcess's
                super().__init__(shortcut)

            def send(self, pending, base, budget):
                if "lean" in what_if and not self._full and all(h.free.get("slots", 0) < 1 for h in base.hosts):
                    self._skipped = True  # nothing can start: the reasons stay as they are
                    self.skipped += 1
                    return
                super().send(pending, base, budget)

        Inline.receive = _timed("sched.core.schedule (in-process)", Inline.receive)
        sched_worker.SchedulerProcess = Inline
    if "worker" in what_if and sched_switch is not None:
        # every session in the worker process, as before sched_switch.py (seams._real_scheduler
        # takes SwitchingScheduler from its module when called)
        sched_switch.SwitchingScheduler = lambda: sched_worker.SchedulerProcess()
    if "groupcommit" in what_if:
        _group_commit(ctl, jobs)
    if "asyncforget" in what_if:
        import queue as _queue

        work: _queue.Queue = _queue.Queue()
        real_forget = agentops.AgentOps.forget

        def worker():
            while True:
                host, units = work.get()
                try:
                    real_forget(host, units)
                except Exception as err:  # a what-if: the units are retried at the next list
                    print(f"asyncforget: {err}", file=sys.stderr)

        threading.Thread(target=worker, daemon=True).start()
        agentops.AgentOps.forget = lambda self, units: work.put((self, list(units)))


def _group_commit(ctl, jobs) -> None:
    """The `groupcommit` what-if: every write of a tick in ONE transaction, committed before the
    first host hears of anything the tick decided (the leases' grants are sent, then the launches):
    today the tick's own record (`record_tick`) is one commit already, the lease grants stored
    before they are sent (leasework.py) are another when due. Writes of other threads (the API's
    submits) keep their own commits; they wait for the tick's (the store's lock is held)."""
    local = threading.local()
    real_write = jobs.JobStore._write

    @contextlib.contextmanager
    def joined(con):
        # a write inside the tick's transaction: a savepoint, so that a failing write undoes only itself
        con.execute("SAVEPOINT bench_w")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK TO bench_w")
            con.execute("RELEASE bench_w")
            raise
        con.execute("RELEASE bench_w")

    def _write(self):
        if getattr(local, "store", None) is self:  # the tick's thread, inside the tick's transaction
            _stats["group commit: writes joined"][0] += 1
            return joined(self._con)
        return real_write(self)

    def commit() -> None:
        store = getattr(local, "store", None)
        if store is not None:
            local.store = None
            try:
                store._con.execute("COMMIT")
            finally:
                store._lock.release()

    real_tick, real_renew = ctl.Controller.tick, ctl.Controller._renew_leases

    def tick(self, now):
        self.store._lock.acquire()
        try:
            self.store._con.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.store._lock.release()
            raise
        local.store = self.store
        try:
            real_tick(self, now)
        except BaseException:
            if getattr(local, "store", None) is not None:
                local.store = None
                self.store._con.execute("ROLLBACK")
                self.store._lock.release()
            raise
        commit()  # a tick that renewed nothing and launched nothing

    def _renew_leases(self):
        commit()  # the intent (and the leases' record) is durable before any host hears of it
        return real_renew(self)

    jobs.JobStore._write = _write
    ctl.Controller.tick = _timed("tick, its group commit included", tick)
    ctl.Controller._renew_leases = _renew_leases


def serve(home: str, stats_path: str, what_if: set[str], trace: int = 0, profile: str | None = None) -> None:
    try:
        from xce_lite.controller.foreground import run_foreground
    except ImportError:  # trees before foreground.py (df9920d) kept it in core
        from xce_lite.controller.core import run_foreground  # type: ignore[no-redef]
    from xce_lite.home.paths import Home

    if profile:
        profile_ticks(profile)  # (under the timers: they time the tick with its profiler)
    _instrument(what_if)
    time_gc(_stats, _stats_lock)

    def _reset(*_args) -> None:  # --behind-sleepers: count from the sleepers' kill only
        with _stats_lock:
            _stats.clear()
            _trace_left[0] = trace

    signal.signal(signal.SIGUSR1, _reset)
    try:
        run_foreground(Home(Path(home)))
    finally:
        with open(stats_path, "w") as f:
            json.dump({**_stats, "_trace": _trace}, f)


def drive(args) -> None:
    from cluster import BenchCluster, wait_done
    from cpu_per_job import submit

    what_if = [w for w in args.what_if.split(",") if w]
    c = BenchCluster(slots=2)
    extra = f"  prefill_depth: {args.depth}\n" if args.depth is not None else ""  # default: the tree's
    extra += "  sched_budget: 64\n" if "budget" in what_if else ""
    config = c.home / "xce.yaml"
    config.write_text(config.read_text().replace("controller:\n", "controller:\n" + extra))
    shm = None
    if "shmspool" in what_if:
        shm = Path(tempfile.mkdtemp(prefix="xbspool-", dir="/dev/shm"))
        (c.home / "spool").symlink_to(shm, target_is_directory=True)
    stats_path = c.root / "stats.json"
    prof_path = args.profile_keep or str(c.root / "ticks.prof")
    with open(c.home / "controller.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", str(c.home),
                                 "--stats", str(stats_path), "--what-if", ",".join(what_if),
                                 "--trace", str(args.trace)]
                                + (["--profile-out", prof_path] if args.profile else []),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    c.pid = proc.pid
    try:
        client = c.client()
        deadline = time.monotonic() + 30
        while True:
            try:
                client.get("/status")
                break
            except Exception:  # not up yet
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError((c.home / "controller.log").read_text()[-2000:])
                time.sleep(0.05)
        c.remember_children()
        spec = c.spec(["true"])
        wait_done(client, client.post("/jobs", {"jobs": [spec] * 10})["ids"], time.monotonic() + 60)
        time.sleep(0.3)
        t_kill, sleepers = 0.0, []
        if args.behind_sleepers:
            ids, sleepers = backlog_behind_sleepers(c, client, spec, args.jobs)
            os.kill(proc.pid, signal.SIGUSR1)  # the step counts start now
            cpu0 = cpu_split(c)
            t0, t_kill = time.perf_counter(), time.time()
            client.post("/jobs/kill", {"ids": sleepers})
            t_sub = time.perf_counter()
        else:
            if args.trace:  # the first steps after the submit (the counts too start there)
                os.kill(proc.pid, signal.SIGUSR1)
                time.sleep(0.05)
            t0, t_kill = time.perf_counter(), time.time()
            if args.one_each:
                ids = [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(args.jobs)]
            else:  # one batch POST, or (--array) one job of N elements as bench/run.py's array line
                ids = submit(client, spec, args.jobs, args.array)
            t_sub = time.perf_counter()
            cpu0 = cpu_split(c)
        measured = ids[: args.measure] if args.measure else ids
        reply = wait_done(client, measured, time.monotonic() + 300)
        wall = time.perf_counter() - t0
        cpu1 = cpu_split(c)
        done = reply["states"].get("DONE", 0) if reply else 0
        path = critical_path(c.home / "xce.db", measured)
        marks = timeline(c.home / "xce.db", sleepers, measured, t_kill) if args.behind_sleepers else {}
        client.post("/controller/stop", {})
        proc.wait(60)
        stats = json.loads(stats_path.read_text())
        traced = stats.pop("_trace", [])
        if args.profile:
            print_profile(prof_path, args.profile)
    finally:
        c.stop()
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    label = ", ".join(what_if) or "as is"
    n = len(measured)
    behind = f" (the first {n} of {args.jobs} submitted)" if n < args.jobs else ""
    how = ("pending behind two sleepers, timed from their kill; 'submit' is the kill's POST" if args.behind_sleepers
           else "one POST each" if args.one_each else "one array" if args.array else "one batch POST")
    print(f"\n{n} jobs{behind} ({how}), what-if: {label}: "
          f"wall {wall:.2f} s = {n / wall:.0f} jobs/s; submit {t_sub - t0:.3f} s; {done} DONE")
    print("  CPU ms per job from the submit's reply to the last measured job done (whole run's parts): "
          + "; ".join(f"{k} {1000 * (cpu1.get(k, 0.0) - v) / n:.3f}" for k, v in cpu0.items()))
    ticks = stats.get("Controller.tick", [0, 0.0])[0]
    print(f"  {ticks} ticks, {ticks / n:.2f} per job (+10 warm-up jobs and the idle ticks are included in the "
          "counts below)")
    if path:
        print("  one job's path, medians over the run (ms): " + "; ".join(f"{k} {v:.2f}" for k, v in path.items()))
    if marks:
        print("  after the kill (ms, store stamps): " + "; ".join(f"{k} {v:.1f}" for k, v in marks.items()))
    print_trace(traced, t_kill)
    # CPU: the calling thread's own (time.thread_time), which a busy machine's other processes do not move
    print(f"  {'step':44} {'calls':>6} {'total s':>8} {'% wall':>7} {'ms/call':>8} {'CPU ms/call':>12}")
    for name, (calls, total, *cpu) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        per_cpu = f"{1000 * cpu[0] / max(calls, 1):12.3f}" if cpu else ""
        print(f"  {name:44} {calls:6d} {total:8.2f} {100 * total / wall:6.1f}% {1000 * total / max(calls, 1):8.2f}"
              f" {per_cpu}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--one-each", action="store_true")
    ap.add_argument("--array", action="store_true", help="one POST of a --jobs-element array (run.py's array line)")
    ap.add_argument("--depth", type=int, default=None, help="controller.prefill_depth")
    ap.add_argument("--measure", type=int, default=0,
                    help="time only the first M jobs (the rest stay pending: a backlog), then stop")
    ap.add_argument("--behind-sleepers", action="store_true",
                    help="as bench/run.py's backlog figure: the --jobs POSTed (1,000 a POST) while two sleepers hold "
                         "the slots; the clock, the CPU and the step counts start at the sleepers' kill")
    ap.add_argument("--what-if", default="", help=f"comma list of {', '.join(WHAT_IFS)}")
    ap.add_argument("--trace", type=int, default=0,
                    help="list the first N timed steps after the kill (--behind-sleepers) or submit, with start times")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile the ticks by thread CPU; print the top N functions (own and cumulative)")
    ap.add_argument("--profile-keep", metavar="FILE", help="with --profile: keep the pstats file there")
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--stats", help=argparse.SUPPRESS)
    args = ap.parse_args()
    what_if = {w for w in args.what_if.split(",") if w}
    if what_if - set(WHAT_IFS):
        ap.error(f"unknown what-if: {', '.join(sorted(what_if - set(WHAT_IFS)))}")
    if args.serve:
        serve(args.serve, args.stats, what_if, args.trace, args.profile_out)
    else:
        drive(args)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
