"""What a simulation comes to, for people: the summary, the job and host tables, one job's story.

Pure functions of a Simulator's state; the same state prints the same text. The summary: jobs by
final state (each job rejected at submit with why, the first MAX_REJECTED), makespan (first submit
to last end), wait time (submit to start) percentiles per queue by nearest rank, and utilisation
per resource (time-weighted use over total x makespan); `summary_json` gives the same as JSON.
"""

from __future__ import annotations

import math

from xce_lite.models import DONE, EXIT, PEND, RUN
from xce_lite.quantities import format_duration
from xce_lite.sched.reasons import format_amount
from xce_lite.sim.engine import REJECTED, WAITING, SimJob, Simulator

PERCENTILES = (50, 90, 99)
MAX_REJECTED = 10  # the summary names this many rejected jobs, with why


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def summary_json(sim: Simulator) -> dict:
    """The summary's figures as one JSON document (`xce sim run --json`); fields are only added."""
    jobs = sim.jobs
    states = {state: 0 for state in (DONE, EXIT, RUN, PEND, REJECTED, WAITING)}
    for job in jobs:
        states[job.state] = states.get(job.state, 0) + 1
    submits = [j.entry.submit for j in jobs if j.state != WAITING]
    ends = [j.end for j in jobs if j.end is not None]
    makespan = (max(ends) if ends else sim.now) - (min(submits) if submits else 0.0)
    waits: dict[str, list[float]] = {}
    for job in jobs:
        if job.start is not None:
            waits.setdefault(job.queue, []).append(job.start - job.entry.submit)
    return {
        "schema": 1, "jobs": len(jobs), "hosts": len(sim.totals), "steps": sim.step_number,
        "sessions": sim.sessions, "clock": sim.now, "states": {k: n for k, n in states.items() if n},
        "makespan": makespan,
        "rejected": [{"id": j.id, "row": j.entry.row, "reason": j.reason} for j in jobs if j.state == REJECTED],
        "wait": {queue: {"jobs": len(v), **{f"p{p}": percentile(sorted(v), p) for p in PERCENTILES}, "max": max(v)}
                 for queue, v in sorted(waits.items())},
        "utilisation": {name: sim.used_seconds[name] / (total * makespan)
                        for name, total in sorted(sim.total_by_resource.items()) if total > 0 and makespan > 0},
    }


def summary(sim: Simulator) -> str:
    return summary_text(summary_json(sim))


def summary_text(figures: dict) -> str:
    """The summary's text from its figures (`summary_json`, or sim/ticked.py's)."""
    makespan, waits = figures["makespan"], figures["wait"]
    lines = [f"simulated {figures['jobs']} jobs on {figures['hosts']} hosts: {figures['steps']} steps, "
             f"{figures['sessions']} scheduling sessions, clock at {figures['clock']:g} s"
             + (" (the controller's tick)" if figures.get("engine") == "tick" else ""),
             "jobs: " + ", ".join(f"{n} {state}" for state, n in figures["states"].items())]
    rejected = figures["rejected"]
    for job in rejected[:MAX_REJECTED]:
        which = f"job {job['id']} (workload row {job['row']})" if "id" in job else f"workload row {job['row']}"
        lines.append(f"  rejected: {which}: {_one_line(job['reason'])}")
    if len(rejected) > MAX_REJECTED:
        lines.append(f"  ... and {len(rejected) - MAX_REJECTED} more rejected (`info job ID` in `xce sim repl`)")
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


def job_line(job: SimJob) -> str:
    where = ",".join(f"{a.host}*{a.tasks}" for a in job.holding.allocs) if job.holding else "-"
    times = f"submit {job.entry.submit:g}"
    if job.start is not None:
        times += f" start {job.start:g}"
    if job.end is not None:
        times += f" end {job.end:g}"
    return (f"{job.id:>6} {job.name or '-':<14} {job.state:<8} {job.queue or '-':<8} {job.entry.user:<8} "
            f"{where:<20} {times}")


def jobs_table(sim: Simulator, states: tuple[str, ...] = (PEND, RUN)) -> str:
    shown = [j for j in sim.jobs if j.state in states]
    head = f"{'JOBID':>6} {'NAME':<14} {'STATE':<8} {'QUEUE':<8} {'USER':<8} {'HOSTS':<20} TIMES"
    return "\n".join([head, *(job_line(j) for j in shown)] if shown else [head, "  (no pending or running jobs)"])


def hosts_table(sim: Simulator) -> str:
    lines = [f"{'HOST':<12} {'JOBS':>5}  FREE / TOTAL"]
    views = sim.host_views()
    for view in views:
        free = ", ".join(f"{name} {format_amount(name, view.free[name])}/{format_amount(name, total)}"
                         for name, total in view.total.items() if total)
        lines.append(f"{view.name:<12} {sim.jobs_on(view.name):>5}  {free}")
    return "\n".join(lines)


def job_detail(sim: Simulator, job_id: int) -> str:
    if not 1 <= job_id <= len(sim.jobs):
        return f"no job {job_id}: the workload has jobs 1 to {len(sim.jobs)}"
    job = sim.jobs[job_id - 1]
    e = job.entry
    lines = [job_line(job), f"  workload row {e.row}: -n {e.slots or 1}{',' + str(e.max_slots) if e.max_slots else ''}"
             f" -R {' '.join(e.resreq) or '(none)'} runtime {e.runtime:g} s exit {e.exit_code}"
             + (f" after {e.after}" if e.after else "")]
    if job.eff is not None:
        lines.append(f"  effective: app {job.eff.app or '(none)'}, tasks {job.eff.min_tasks}..{job.eff.max_tasks}, "
                     f"run limit {job.eff.run_limit if job.eff.run_limit is not None else 'none'}")
    if job.reason:
        lines.append(f"  {'why it waits' if job.state == PEND else 'reason'}: {job.reason}")
    if job.exit_code is not None:
        lines.append(f"  exit code {job.exit_code}")
    return "\n".join(lines)
