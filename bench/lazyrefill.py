#!/usr/bin/env python3
"""What if a chain of queued successors were refilled lazily? bench/ticktime.py with one more what-if.

    python bench/lazyrefill.py --lazy-ms M [ticktime's options: --jobs 1000 --depth 3 ...]
    python bench/lazyrefill.py --lazy-ms 0 --jobs 1000     # M = 0: as ticktime.py, plus the counters
    python bench/lazyrefill.py --lazy-ms inf --jobs 1000   # a chain refilled only when its queued part is empty
    python bench/lazyrefill.py --lazy-ms 5 --no-wake       # put off until a tick comes anyway, no timer
    python bench/lazyrefill.py --lazy-ms inf --whole       # + a refill names the whole chain in one session

Today (controller.prefill_depth 2, prefilling.py's `Prefill._name`) every end refills its chain at once:
A runs, B waits behind A, C behind B; A ends, B starts, and the very next session names D behind C.
Here a queued successor (a chain's tail, `job.after` set) takes no follower while it was named less
than M ms ago (the chain still has >= 1 queued job, so its slot does not idle): the refill is put off,
and a timer wakes the tick (`state.dirty`, `state.wake`) when the M ms are up, as a real implementation
would have to. A unit that runs with nothing queued behind it (an empty chain) is refilled at once.
M = 0 changes nothing (a control with the same counters); M = inf: a chain is refilled only when its
queued part is empty (no timer: the start of its last queued job reaches the controller and ticks);
--no-wake: no timer, the refill waits for a tick that comes for something else (an end, a start).
--whole: a session that names a successor names again behind it, up to the depth, in the same session
(today one link per session: a chain emptied takes `depth` sessions to fill again).

It runs ticktime.py's driver and its timed controller process (this file stands in for ticktime.py as
the `--serve` child: `ticktime.__file__`; M reaches the child in XCE_BENCH_LAZY_MS) and adds to its
step table: "lazy: refills put off" (a tail passed over in a session, counted per session and tail),
"lazy: wake timers" and "Prefill._started (a queued successor started)" (jobs that started as queued
successors: their host's agent started them when their predecessor ended). Nothing in xce_lite/ changes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ticktime  # (bench/ on the path first)

ENV = "XCE_BENCH_LAZY_MS"


def _lazy(ms: float, wake_up: bool, whole: bool) -> None:
    """Patch the controller (this process only): refills put off as the module docstring says."""
    from xce_lite.controller import prefill_chains, prefilling
    from xce_lite.sched.core import Decisions, Dispatch

    stats, lock = ticktime._stats, ticktime._stats_lock
    named_at: dict[int, float] = {}  # queued successor -> when it was named (its chain's last refill)
    # this session's taken units, the earliest refill due, --whole's round and the chains' depth
    seen: dict[str, object] = {"taken": set(), "due": None, "round": 0, "depth": 2}
    timer: list[threading.Timer | None] = [None]
    real_depth, real_name, real_unit = prefill_chains.chain_depth, prefilling.Prefill._name, prefilling.RunningUnit
    deep: dict[int, int] = {}  # --whole: a successor named in this session -> its depth in its chain

    def running_unit(*args, **kwargs):
        # --whole: a unit dispatched in this session (or named in an earlier round) is taken when
        # it has a follower now or its chain is full
        unit = real_unit(*args, **kwargs)
        if unit.job_id in seen["taken"] or deep.get(unit.job_id, 0) >= seen["depth"]:  # type: ignore[operator]
            unit = replace(unit, taken=True)
        return unit

    def chain_depth(job, active) -> int:
        depth = real_depth(job, active)
        if ms <= 0 or job.after is None or job.id in seen["taken"] or seen["round"]:  # type: ignore[operator]
            return depth  # a running unit (an empty chain), or a link with a follower already
        since = time.monotonic() - named_at.get(job.id, 0.0)
        if since >= ms / 1000:
            return depth
        with lock:
            stats["lazy: refills put off"][0] += 1
        due = ms / 1000 - since
        seen["due"] = due if seen["due"] is None else min(due, seen["due"])  # type: ignore[type-var]
        return 1 << 30  # "too deep": not a candidate in this session

    def _name(self, decisions, hosts, shared, now, closing):
        with self.state.mu:
            seen["taken"], seen["due"] = set(self.state.behind.values()) | set(self.started_early.values()), None
        seen["round"] = 0
        chosen = real_name(self, decisions, hosts, shared, now, closing)
        if whole and chosen and decisions is not None:
            chosen = _rounds(self, decisions, hosts, shared, now, closing, chosen)
        at = time.monotonic()
        for s in chosen:
            named_at[s.job_id] = at
        if len(named_at) > 4 * len(self.state.behind) + 64:  # forget the ones that left their chains
            for job_id in [j for j in named_at if j not in self.state.behind]:
                del named_at[job_id]
        if wake_up and seen["due"] is not None and seen["due"] != float("inf") and timer[0] is None:
            state = self.state

            def wake() -> None:
                timer[0] = None
                with state.mu:
                    state.dirty = True  # a session comes, and with it the refill put off
                state.wake.set()

            timer[0] = threading.Timer(seen["due"], wake)  # type: ignore[arg-type]
            timer[0].daemon = True
            timer[0].start()
            with lock:
                stats["lazy: wake timers"][0] += 1
        return chosen

    def _rounds(self, decisions, hosts, shared, now, closing, chosen):
        # --whole: name again behind the successors just named, until each chain is full (one
        # session refills a chain to its depth, not one link per tick)
        seen["depth"] = self.state.config.controller.prefill_depth
        deep.clear()
        everyone = list(chosen)
        prefilling.RunningUnit = running_unit
        try:
            while chosen and seen["round"] < seen["depth"] - 1:  # type: ignore[operator]
                seen["round"] += 1  # type: ignore[operator]
                with self.state.mu:
                    for s in chosen:
                        pred = self.state.active.get(s.after)
                        deep[s.job_id] = deep.get(s.after, real_depth(pred, self.state.active) if pred else 0) + 1
                    seen["taken"] = set(self.state.behind.values()) | set(self.started_early.values())
                    decisions = Decisions(decisions.dispatches + tuple(Dispatch(s.job_id, s.placement, s.profile_hash)
                                                                       for s in chosen),
                                          decisions.waiting, decisions.complete)
                chosen = real_name(self, decisions, hosts, shared, now, closing)
                everyone += chosen
                with lock:
                    stats["whole: successors named in a later round"][0] += len(chosen)
        finally:
            prefilling.RunningUnit = real_unit
        return tuple(everyone)

    prefilling.chain_depth = chain_depth
    prefilling.Prefill._name = _name
    prefilling.Prefill._started = ticktime._timed("Prefill._started (a queued successor started)",
                                                  prefilling.Prefill._started)


def main() -> int:
    argv = sys.argv[1:]
    if "--lazy-ms" in argv:  # the driver: M for the child, through its environment
        i = argv.index("--lazy-ms")
        os.environ[ENV] = argv[i + 1]
        del argv[i:i + 2]
        for flag in ("--no-wake", "--whole"):
            if flag in argv:
                argv.remove(flag)
                os.environ[ENV] += "," + flag[2:]
        print(f"lazy refill: M = {os.environ[ENV]} ms")
    if "--serve" in argv:
        ms, *flags = os.environ.get(ENV, "0").split(",")
        _lazy(float(ms), "no-wake" not in flags, "whole" in flags)
    ticktime.__file__ = str(Path(__file__).resolve())  # the --serve child is this file
    sys.argv[1:] = argv
    return ticktime.main()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
