"""What bench/ticktime.py measures inside its timed controller beside its step timers: the cycle
collector's passes, and (--profile) a cProfile of the ticks by the thread's CPU.

    python bench/ticktime.py --jobs 1000 [--array] --profile 40 [--profile-keep FILE]

`time_gc` counts each collector pass as a step ("gc generation N"). `profile_ticks` runs in
ticktime's timed controller process (its --serve child): every `Controller.tick` is profiled, timed
by `time.thread_time` (what the other processes of a busy box do not move; the ticks' timers of
ticktime.py run inside it and cost a little), and the stats are dumped at the process's exit.
`print_profile` prints the top N functions by own time, then by cumulative time. cProfile's own
cost inflates every figure (about 2-3x here): read the shares, not the milliseconds.
"""

from __future__ import annotations

import atexit
import cProfile
import functools
import pstats
import threading
import time


def time_gc(stats: dict, lock: threading.Lock) -> None:
    """The cycle collector's passes in the controller, by generation, as steps of `stats` ("gc generation
    N": calls, wall s, CPU s): with 10,000s of jobs held, a pass over the oldest generation is a long
    pause of every thread."""
    import gc

    began: dict[str, tuple[float, float]] = {}

    def callback(phase: str, info: dict) -> None:
        name = f"gc generation {info['generation']}"
        if phase == "start":
            began[name] = (time.perf_counter(), time.thread_time())
        elif name in began:
            t0, c0 = began.pop(name)
            with lock:
                entry = stats[name]
                entry[0] += 1
                entry[1] += time.perf_counter() - t0
                entry[2] += time.thread_time() - c0

    gc.callbacks.append(callback)


def profile_ticks(path: str) -> None:
    """Profile every `Controller.tick` from now on; dump the stats (pstats) to `path` at exit."""
    from xce_lite.controller import core as ctl

    prof = cProfile.Profile(time.thread_time)
    tick = ctl.Controller.tick

    @functools.wraps(tick)
    def profiled(self, *args, **kwargs):
        prof.enable()
        try:
            return tick(self, *args, **kwargs)
        finally:
            prof.disable()

    ctl.Controller.tick = profiled
    atexit.register(prof.dump_stats, path)


def print_profile(path: str, top: int) -> None:
    """The `top` functions of the stats at `path`, by own time, then by cumulative time."""
    print(f"\ncProfile of the ticks (thread CPU s), top {top} by own time, then by cumulative:")
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
