"""bench/ticktime.py's readings of a finished run: the critical path of each job from the store's
events, the CPU split between the controller's threads, the scheduler's processes and the agent,
and the backlog set-up behind sleepers that bench/run.py's backlog figure uses."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path


def critical_path(store: Path, ids: list[int]) -> dict[str, float]:
    """Medians of the steps of one job's life, from the store's own stamps (read-only).

    dispatched: the controller's clock when it recorded the dispatch (after scheduling);
    start_time: the agent's clock as it forked the supervisor; end_time: the supervisor's clock
    after wait4; finished: the controller's clock when it took the finished event; then the gap
    from a job's finish to the next dispatch (the slot standing empty).
    """
    import bisect
    import statistics

    import apsw

    con = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        lo, hi = min(ids), max(ids)
        ev: dict[int, dict[str, float]] = defaultdict(dict)
        for job_id, kind, t in con.execute(
                "SELECT job_id, kind, time FROM events WHERE job_id BETWEEN ? AND ?", (lo, hi)):
            ev[job_id][kind] = t
        rows = {job_id: (st, et) for job_id, st, et in con.execute(
            "SELECT id, start_time, end_time FROM jobs WHERE id BETWEEN ? AND ?", (lo, hi))}
    finally:
        con.close()
    disp_times = sorted(e["dispatched"] for e in ev.values() if "dispatched" in e)
    parts: dict[str, list[float]] = defaultdict(list)
    for job_id, e in ev.items():
        st, et = rows.get(job_id, (None, None))
        if not {"dispatched", "started", "finished"} <= e.keys() or st is None or et is None:
            continue
        parts["dispatch->agent forks supervisor"].append(st - e["dispatched"])
        parts["agent fork->job ended (supervisor, job)"].append(et - st)
        parts["job ended->controller has the event"].append(e["finished"] - et)
        k = bisect.bisect_right(disp_times, e["finished"])
        if k < len(disp_times):
            parts["event->next dispatch (slot empty)"].append(disp_times[k] - e["finished"])
    return {k: 1000 * statistics.median(v) for k, v in parts.items() if v}


def timeline(store: Path, sleepers: list[int], ids: list[int], t_kill: float) -> dict[str, float]:
    """--behind-sleepers: when things happened after the kill's POST (`t_kill`, time.time()), in ms
    from the store's own stamps: the sleepers' ends, the first and the 2nd dispatch of the backlog,
    and the rate of the rest (the steady part: its jobs per second, from the 3rd dispatch on)."""
    import apsw

    con = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        marks = ",".join("?" * len(sleepers))
        asked = [t for (t,) in con.execute(
            f"SELECT time FROM events WHERE kind='kill_requested' AND job_id IN ({marks})", sleepers)]
        unit_ends = [t for (t,) in con.execute(f"SELECT end_time FROM jobs WHERE id IN ({marks})", sleepers) if t]
        ends = [t for (t,) in con.execute(
            f"SELECT time FROM events WHERE kind='finished' AND job_id IN ({marks})", sleepers)]
        lo, hi = min(ids), max(ids)
        disp = sorted(t for (t,) in con.execute(
            "SELECT time FROM events WHERE kind='dispatched' AND job_id BETWEEN ? AND ?", (lo, hi)))
        fin = sorted(t for (t,) in con.execute(
            "SELECT time FROM events WHERE kind='finished' AND job_id BETWEEN ? AND ?", (lo, hi)))
    finally:
        con.close()
    out: dict[str, float] = {}
    if asked:
        out["kill->kill_requested"] = 1000 * (max(asked) - t_kill)
    if unit_ends:
        out["kill->last sleeper's unit ended (host clock)"] = 1000 * (max(unit_ends) - t_kill)
    if ends:
        out["kill->last sleeper's end recorded"] = 1000 * (max(ends) - t_kill)
    if disp:
        out["kill->first dispatch"] = 1000 * (disp[0] - t_kill)
    if len(disp) > 1:
        out["kill->2nd dispatch"] = 1000 * (disp[1] - t_kill)
    if fin:
        out["kill->first job finished"] = 1000 * (fin[0] - t_kill)
        out["kill->last job finished"] = 1000 * (fin[-1] - t_kill)
    if len(fin) > 10:
        out["steady jobs/s (3rd finish to last)"] = (len(fin) - 3) / max(fin[-1] - fin[2], 1e-9)
    return out


def count_reasons(store_class, stats, lock) -> None:
    """In the timed controller: the pend reasons each tick's commit stores, summed as a step's
    "calls" ("pend reasons stored (rows)"): a backlog's reasons are rows written, ~3 us each."""
    real = store_class.record_tick

    def record_tick(self, w):
        with lock:
            stats["pend reasons stored (rows)"][0] += len(w.reasons)
        return real(self, w)

    store_class.record_tick = record_tick


def print_trace(traced: list, t_kill: float) -> None:
    """--trace: the first steps after the kill (or the submit), by start, in ms from its POST."""
    if traced:
        print(f"  the first {len(traced)} steps after the kill or submit (ms from its POST: start, wall, CPU):")
        for name, start, dt, dc in sorted(traced, key=lambda r: r[1]):
            print(f"    {1000 * (start - t_kill):8.2f} {1000 * dt:7.2f} {1000 * dc:7.2f}  {name}")


def cpu_split(c) -> dict[str, float]:
    """CPU seconds so far of the controller's main thread, its other threads (API, heartbeat, agent
    links), the scheduler's processes (forkserver, worker) and the agent with its children, read
    with psutil from outside (a process that ended in between drops out of its part)."""
    import psutil

    from cluster import is_agent

    parts = {"main thread": 0.0, "other threads": 0.0, "scheduler processes": 0.0, "agent+jobs": 0.0}
    try:
        ctl = psutil.Process(c.pid)
        for t in ctl.threads():
            parts["main thread" if t.id == c.pid else "other threads"] += t.user_time + t.system_time
        for child in ctl.children(recursive=False):
            try:
                tree = [child, *child.children(recursive=True)]
                key = "agent+jobs" if is_agent(child.cmdline()) else "scheduler processes"
                for q in tree:
                    t = q.cpu_times()
                    parts[key] += t.user + t.system + t.children_user + t.children_system
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass
    return parts


def backlog_behind_sleepers(c, client, spec: dict, n: int) -> tuple[list[int], list[int]]:
    """bench/run.py's backlog figure: two `sleep 600` jobs take both slots, `n` jobs are POSTed in
    batches of 1,000 behind them, and a session sees the last one (its pend reason is stored).
    The ids of the backlog and of the sleepers, not yet killed."""
    sleepers = client.post("/jobs", {"jobs": [c.spec(["sleep", "600"])] * 2})["ids"]
    deadline = time.monotonic() + 30
    while {j["state"] for j in client.get("/jobs", ids=",".join(map(str, sleepers)))["jobs"]} != {"RUN"}:
        if time.monotonic() > deadline:
            raise RuntimeError("the sleepers did not reach RUN within 30 s")
        time.sleep(0.05)
    ids: list[int] = []
    for k in range(0, n, 1000):
        ids += client.post("/jobs", {"jobs": [spec] * min(1000, n - k)})["ids"]
    deadline = time.monotonic() + 120
    while not client.get("/jobs", ids=str(ids[-1]))["jobs"][0]["pend_reason"]:
        if time.monotonic() > deadline:
            raise RuntimeError("no session stored the last job's pend reason within 120 s")
        time.sleep(0.02)
    time.sleep(0.2)
    return ids, sleepers
