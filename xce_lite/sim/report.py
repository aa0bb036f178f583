"""What a simulation comes to, for people: the summary, the job and host tables, one job's story.

Pure reads of a TickSimulation (its controller's store and view); the same state prints the same
text. The summary: jobs by final state (each job rejected at submit with why, the first
MAX_REJECTED), makespan (first submit to last end), wait time (submit to start) percentiles per
queue by nearest rank, and utilisation per resource (each job's last attempt: what it reserved x
how long it ran, over total x makespan); `summary_json` gives the same as JSON.
"""

from __future__ import annotations

import math

from xce_lite.models import DISP, PEND, RUN
from xce_lite.quantities import format_duration
from xce_lite.sched.reasons import format_amount
from xce_lite.sim.ticked import Outcome, TickSimulation

PERCENTILES = (50, 90, 99)
MAX_REJECTED = 10  # the summary names this many rejected jobs, with why


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def summary_json(sim: TickSimulation) -> dict:
    """The summary's figures as one JSON document (`xce sim run --json`); fields are only added."""
    jobs = sim.outcomes()
    states: dict[str, int] = {}
    for job in jobs:
        states[job.state] = states.get(job.state, 0) + 1
    if sim.rejected:
        states["REJECTED"] = len(sim.rejected)
    waiting = len(sim.entries) - sim._next
    if waiting:
        states["WAIT"] = waiting
    ends = [j.end for j in jobs if j.end is not None]
    submits = [j.submit for j in jobs]
    makespan = (max(ends) if ends else sim.now) - (min(submits) if submits else 0.0)
    waits: dict[str, list[float]] = {}
    for job in jobs:
        if job.start is not None:
            waits.setdefault(job.queue, []).append(job.start - job.submit)
    totals: dict[str, float] = {}
    for view in sim.run.ctl.state.host_totals:
        for name, amount in view.total.items():
            totals[name] = totals.get(name, 0) + amount
    used: dict[str, float] = dict.fromkeys(totals, 0.0)
    for job in jobs:  # the last attempt's use (an attempt requeued before is not counted)
        if job.start is None or job.alloc is None:
            continue
        span = (job.end if job.end is not None else sim.now) - job.start
        for alloc in job.alloc.get("allocs", ()):
            for name, amount in (alloc[2] or {}).items():
                if name in used:
                    used[name] += amount * span
    return {
        "schema": 1, "engine": "tick", "jobs": len(jobs) + len(sim.rejected) + waiting,
        "hosts": len(sim.config.hosts), "steps": sim.steps, "sessions": sim.sessions, "clock": sim.now,
        "states": states, "makespan": makespan,
        "retried": sum(j.attempt > 1 for j in jobs),
        "rejected": [{"row": row, "reason": why} for row, why in sim.rejected],
        "wait": {queue: {"jobs": len(v), **{f"p{p}": percentile(sorted(v), p) for p in PERCENTILES},
                         "max": max(v)} for queue, v in sorted(waits.items())},
        "utilisation": {name: used[name] / (total * makespan)
                        for name, total in sorted(totals.items()) if total > 0 and makespan > 0},
        "host_events": [line for line in sim.logs if " lost" in line],
    }


def summary(sim: TickSimulation) -> str:
    return summary_text(summary_json(sim))


def summary_text(figures: dict) -> str:
    """The summary's text from its figures (`summary_json`)."""
    makespan, waits = figures["makespan"], figures["wait"]
    lines = [f"simulated {figures['jobs']} jobs on {figures['hosts']} hosts: {figures['steps']} steps, "
             f"{figures['sessions']} scheduling sessions, clock at {figures['clock']:g} s",
             "jobs: " + ", ".join(f"{n} {state}" for state, n in figures["states"].items())]
    rejected = figures["rejected"]
    for job in rejected[:MAX_REJECTED]:
        lines.append(f"  rejected: workload row {job['row']}: {_one_line(job['reason'])}")
    if len(rejected) > MAX_REJECTED:
        lines.append(f"  ... and {len(rejected) - MAX_REJECTED} more rejected (`xce sim repl` shows each as it "
                     f"happens)")
    lines.append(f"makespan: {makespan:g} s ({format_duration(makespan)})")
    lines.append("wait time (s) by queue:" + (" none started" if not waits else ""))
    if waits:
        lines.append(f"  {'queue':<12} {'jobs':>7} " + " ".join(f"{'p' + str(p):>9}" for p in PERCENTILES)
                     + f" {'max':>9}")
        for queue, w in waits.items():
            cells = " ".join(f"{w[f'p{p}']:>9g}" for p in PERCENTILES)
            lines.append(f"  {queue:<12} {w['jobs']:>7} {cells} {w['max']:>9g}")
    parts = [f"{name} {100 * share:.1f}%" for name, share in figures["utilisation"].items()]
    lines.append("utilisation: " + (", ".join(parts) if parts else "nothing ran"))
    if figures.get("retried"):
        lines.append(f"retried: {figures['retried']} job(s) ran more than once (retry, or requeued after a host loss)")
    lines.extend(f"host event: {line}" for line in figures.get("host_events", ()))
    return "\n".join(lines)


def _one_line(text: str | None) -> str:
    return " ".join((text or "no reason recorded").split())


def job_line(job: Outcome) -> str:
    where = ",".join(f"{h}*{n}" for h, n in job.hosts) if job.hosts else "-"
    times = f"submit {job.submit:g}"
    if job.start is not None:
        times += f" start {job.start:g}"
    if job.end is not None:
        times += f" end {job.end:g}"
    return (f"{job.id:>6} {job.name or '-':<14} {job.state:<8} {job.queue or '-':<8} {job.user:<8} "
            f"{where:<20} {times}")


def jobs_table(sim: TickSimulation, states: tuple[str, ...] = (PEND, DISP, RUN)) -> str:
    shown = [j for j in sim.outcomes(include_finished=False) if j.state in states]
    head = f"{'JOBID':>6} {'NAME':<14} {'STATE':<8} {'QUEUE':<8} {'USER':<8} {'HOSTS':<20} TIMES"
    return "\n".join([head, *(job_line(j) for j in shown)] if shown else [head, "  (no pending or running jobs)"])


def hosts_table(sim: TickSimulation) -> str:
    lines = [f"{'HOST':<12} {'JOBS':>5}  FREE / TOTAL"]
    jobs_on = sim.run.jobs_on()
    for view in sim.run.host_views():
        free = ", ".join(f"{name} {format_amount(name, view.free[name])}/{format_amount(name, total)}"
                         for name, total in view.total.items() if total)
        state = "" if view.state == "ok" else f"  ({view.state})"
        lines.append(f"{view.name:<12} {jobs_on.get(view.name, 0):>5}  {free}{state}")
    return "\n".join(lines)


def job_detail(sim: TickSimulation, job_id: int) -> str:
    found = sim.outcomes([job_id])
    if not found:
        return f"no job {job_id} (yet): jobs get their ids as they are submitted, in submit order"
    job = found[0]
    lines = [job_line(job)]
    e = next((e for e in sim.entries if e.row == job.row), None)
    if e is not None:
        lines.append(f"  workload row {e.row}: -n {e.slots or 1}{',' + str(e.max_slots) if e.max_slots else ''}"
                     f" -R {' '.join(e.resreq) or '(none)'} runtime {e.runtime:g} s exit {e.exit_code}"
                     + (f" after {e.after}" if e.after else "") + (f" retry {e.retry}" if e.retry else ""))
    if job.effective is not None:
        eff = job.effective
        limit = eff.get("run_limit")
        lines.append(f"  effective: app {eff.get('app') or '(none)'}, tasks {eff.get('min_tasks')}.."
                     f"{eff.get('max_tasks')}, run limit {limit if limit is not None else 'none'}")
    if job.attempt > 1:
        lines.append(f"  attempt {job.attempt}")
    reason = sim.run.live_reason(job.id) if job.state == PEND else job.reason
    if reason:
        lines.append(f"  {'why it waits' if job.state == PEND else 'reason'}: {reason}")
    if job.exit_code is not None:
        lines.append(f"  exit code {job.exit_code}")
    return "\n".join(lines)
