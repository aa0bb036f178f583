"""`xce hist` (LSF's bhist: every event of jobs, in order) and `xce acct` (bacct, sacct: finished
jobs summed by user, project, queue or host). Thin: the controller selects, sums and parses the
times (GET /jobs/history, /accounting/summary); this prints. Light: click only.
"""

from __future__ import annotations

import json

import click

from xce_lite.cli.base import JSON_OPTION, client, echo_json, echo_table
from xce_lite.cli.jobs import when
from xce_lite.quantities import format_duration, format_size

_WHEN = "an ISO date (2026-11-30), a date and time (2026-11-30T14:00), an age (7d, 12h, 30m), today or yesterday"


@click.command()
@click.option("-u", "user", metavar="USER", help="This user's jobs; `all` for everyone's (default: yours).")
@click.option("-P", "project", metavar="PATH", help="Jobs of this project and the projects below it.")
@click.option("--since", metavar="TIME", help=f"Jobs still alive at or after TIME: {_WHEN} (default: 7d).")
@click.option("--until", metavar="TIME", help="Jobs submitted before TIME.")
@JSON_OPTION
@click.argument("ids", nargs=-1)
@click.pass_context
def hist(ctx, user, project, since, until, as_json, ids) -> None:
    """Every event of jobs, in order, with the time spent in each state (LSF's bhist); finished
    jobs too, and those retention archived. IDS: 42, 42[7] (an element), or an array's 42 for all
    its elements; without IDS, your jobs alive in the last 7 days (--since, --until, -u, -P).

    Example: xce hist 42
    """
    reply = client(ctx).get("/jobs/history", ids=",".join(ids) or None, user=user, project=project,
                             since=since, until=until)
    if as_json:
        echo_json(reply)
        return
    if not reply["jobs"]:
        click.echo("No job found")
        return
    blocks = [_history(job) for job in reply["jobs"]]
    click.echo("\n".join(blocks))
    if reply["truncated"]:
        click.echo(f"(only the newest {len(reply['jobs'])} jobs are shown: narrow with --since, --until, -u or IDS)",
                   err=True)


def _history(job: dict) -> str:
    project = job["project"] or "-"
    archived = "  [archived]" if job["archived"] else ""
    lines = [f"Job <{job['display_id']}>, Job Name <{job['name']}>, User <{job['user']}>, Project <{project}>, "
             f"Queue <{job['queue']}>, Status <{job['state']}>{archived}",
             f"  Command: {json.dumps(job['command'], ensure_ascii=False)}" if "command" in job
             else "  Command: shown to its owner and the admins only"]  # a shared cluster's visibility: summary
    for event in job["events"]:
        lines.append(f"  {when(event['time'])}: {sentence(event)}")
    spent = job["time_in_states"]
    if spent:
        parts = [f"{state} {_seconds(spent[state])}" for state in ("PEND", "PSUSP", "DISP", "RUN", "USUSP")
                 if state in spent]
        lines.append("  Time in states: " + "  ".join(parts + [f"total {_seconds(spent.get('total', 0))}"]))
    return "\n".join(lines) + "\n"


def sentence(event: dict) -> str:
    """An event as a line of its job's history."""
    data = event.get("data") or {}
    kind = event["kind"]
    reason = f": {data['reason']}" if data.get("reason") else ""
    if kind == "submitted":
        return f"Submitted to queue <{data.get('queue')}> by user <{data.get('user')}>" + (
            ", held" if data.get("held") else "")
    if kind == "dispatched":
        hosts = " ".join(f"{n}*{h}" if n > 1 else h for h, n in data.get("hosts") or [])
        return f"Dispatched to <{hosts}>, attempt {data.get('attempt')}" + (
            f", application {data['app']}" if data.get("app") else "")
    if kind == "started":
        return "Started"
    if kind == "finished":
        usage = ""
        if data.get("cpu_time") is not None:
            usage = f"; CPU time {data['cpu_time']:.2f} s, max memory {format_size(data.get('max_rss') or 0)}"
        if data.get("state") == "DONE":
            return "Done successfully" + usage
        code = f"killed by signal {data['signal']}" if data.get("signal") else (
            f"exit code {data['exit_code']}" if data.get("exit_code") is not None else "no exit code")
        return f"Exited with {code}{reason}{usage}"
    if kind == "requeued":
        retry = " to retry" if data.get("retry") else ""
        return f"Requeued{retry} ({data.get('from')} -> {data.get('to')}){reason}"
    if kind == "kill_requested":
        return f"Kill requested by {data.get('by')}"
    if kind == "host_hooks":
        return f"Host hooks on {data.get('host')}: " + (data["note"] if data.get("note") else
                                                        f"{len(data.get('hooks') or ())} ran, all ok")
    words = {"held": "Held", "released": "Released", "suspended": "Suspended", "resumed": "Resumed",
             "killed_pending": "Killed while pending", "launch_failed": "Launch failed", "lost": "Lost",
             "dependency_failed": "Cancelled, its dependency can never be met",
             "dispatch_declined": "Dispatch declined"}
    return words.get(kind, kind) + reason


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}s" if value < 60 else format_duration(value)


@click.command()
@click.option("--by", type=click.Choice(["user", "project", "queue", "host"]), default="user", show_default=True,
              help="One line per user, project, queue, or host (the host that ran the job's command).")
@click.option("-u", "user", metavar="USER", help="Only this user's jobs (default: everyone's; `all` too).")
@click.option("-P", "project", metavar="PATH", help="Only jobs of this project and the projects below it.")
@click.option("--since", metavar="TIME", help=f"Jobs that ended at or after TIME: {_WHEN} (default: 30d).")
@click.option("--until", metavar="TIME", help="Jobs that ended before TIME (default: now).")
@JSON_OPTION
@click.pass_context
def acct(ctx, by, user, project, since, until, as_json) -> None:
    """Usage of finished jobs (LSF's bacct, Slurm's sacct): jobs done and exited, wait time
    (median, 95th percentile), run time, CPU time, peak memory, slot-hours, GPU-hours and
    efficiency (CPU time / slot time), per user, project, queue or host; archived jobs included.
    A `~` marks percentiles read from archived day sums (within ~10%).

    Example: xce acct --by queue --since 7d
    """
    reply = client(ctx).get("/accounting/summary", by=by, user=user, project=project, since=since, until=until)
    if as_json:
        echo_json(reply)
        return
    click.echo(f"Finished jobs that ended from {when(reply['since'])} to {when(reply['until'])}, by {by}")
    if not reply["rows"]:
        click.echo("No finished job in that time")
        return
    rows: list[tuple[str, ...]] = [(by.upper(), "JOBS", "DONE", "EXIT", "WAIT_MEDIAN", "WAIT_P95", "RUN_TIME",
                                    "CPU_TIME", "MAX_MEM", "SLOT_HOURS", "GPU_HOURS", "EFFICIENCY")]
    for row in reply["rows"]:
        rows.append(_acct_row(row["key"] or "-", row))
    if len(reply["rows"]) > 1:
        rows.append(_acct_row("TOTAL", reply["total"]))
    echo_table(rows)


def _acct_row(key: str, r: dict) -> tuple[str, ...]:
    mark = "" if r["wait"]["exact"] else "~"
    efficiency = "-" if r["efficiency"] is None else f"{r['efficiency'] * 100:.0f}%"
    return (key, str(r["jobs"]), str(r["done"]), str(r["exit"]), mark + _seconds(r["wait"]["median"]),
            mark + _seconds(r["wait"]["p95"]), _seconds(r["run"]["total"]), _seconds(r["cpu_time"]),
            format_size(r["max_rss"]) if r["max_rss"] else "-", f"{r['slot_hours']:.2f}", f"{r['gpu_hours']:.2f}",
            efficiency)
