"""`xce jobs`: jobs and arrays as LSF users expect them (an array is one line unless --elements;
`-p` groups an array's pending elements that wait for the same reason). Light: click only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import click

from xce_lite.cli.apps import effective_lines
from xce_lite.cli.base import client, table_lines
from xce_lite.quantities import format_duration, format_size


@click.command()
@click.option("-a", "show_all", is_flag=True, help="Include finished jobs.")
@click.option("-l", "long", is_flag=True, help="Every field of each job.")
@click.option("-p", "pending", is_flag=True, help="Pending jobs only, each with why it waits (unmet dependencies "
                                                   "by name and state), and jobs queued on a host behind another.")
@click.option("-u", "user", help="This user's jobs; `all` for everyone's (default: yours).")
@click.option("-P", "project", metavar="PATH", help="Jobs of this project only (lab/vision; see `xce projects`).")
@click.option("--elements", is_flag=True, help="Each element of an array (42[7]), not one line per array.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: {schema: 1, jobs: [...], arrays: [...]}.")
@click.argument("ids", nargs=-1)
@click.pass_context
def jobs(ctx, show_all, long, pending, user, project, elements, as_json, ids) -> None:
    """List jobs, LSF-style (unfinished ones unless -a or ids are given); an array is one line
    (`42[1-20]`, its elements counted by state) unless --elements. IDS: 42, or 42[7] for an element.

    Example: xce jobs -a -u all
    """
    reply = client(ctx).get("/jobs", ids=",".join(ids) or None, all=show_all, user=user, project=project,
                             effective=long or None, history=long or None, elements=elements or pending or None)
    if pending:
        reply["jobs"] = [j for j in reply["jobs"] if j["state"] in ("PEND", "PSUSP")]
        reply["arrays"] = []
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    if not reply["jobs"] and not reply["arrays"]:
        click.echo("No unfinished job found" if not show_all else "No job found")
        return
    if long:
        click.echo("\n".join([_long(job) for job in reply["jobs"]] + [_long_array(a) for a in reply["arrays"]]))
        return
    if pending:
        for first, last, job in _pending_groups(reply["jobs"]):
            why = "\n  ".join(waits(job)) or ("held" if job["state"] == "PSUSP" else "not scheduled yet")
            shown = display(first) if first is last else f"{first['array_id']}[{first['array_index']}-" \
                                                           f"{last['array_index']}]"
            click.echo(f"{shown}  {job['user']}  {job['state']}  {_clip(job['name'], 24)}\n  {why}")
        return
    rows: list[tuple[str, ...]] = [("JOBID", "USER", "STAT", "QUEUE", "SLOTS", "EXEC_HOST", "JOB_NAME", "SUBMIT_TIME")]
    lines = [(job["id"], _row(job)) for job in reply["jobs"]] + [(a["id"], _array_row(a)) for a in reply["arrays"]]
    rows.extend(row for _id, row in sorted(lines, key=lambda pair: pair[0]))
    _table(rows)


def _queued(job: dict) -> bool:
    """A queued successor (prefill): on its host behind another job, not started; shown PEND."""
    return job.get("queued_behind") is not None


def waits(job: dict) -> list[str]:
    """Why a waiting job waits, as lines: its pend reason (a queued successor keeps the one a
    dispatch would give it), then, for a queued successor, where it waits and until when."""
    if job["state"] != "PEND":
        return []
    lines = [job["pend_reason"]] if job["pend_reason"] else []
    if _queued(job):
        lines.append(f"queued on {job['hosts'][0][0]} behind job {job['queued_behind']}: starts when it ends")
    return lines


def display(job: dict) -> str:
    return job.get("display_id") or str(job["id"])


def _row(job: dict) -> tuple[str, ...]:
    # A queued successor has not started: no execution host yet, as bjobs shows a PEND job
    hosts = "-" if _queued(job) else ",".join(f"{n}*{h}" if n > 1 else h for h, n in job["hosts"]) or "-"
    name = job["name"] + (f"[{job['array_index']}]" if job.get("array_index") else "")
    return (display(job), job["user"], job["state"], job["queue"], str(job["slots"]), hosts, _clip(name, 24),
            when(job["submit_time"]))


def _array_row(array: dict) -> tuple[str, ...]:
    """One line for a whole array: its elements counted by state where the hosts would be."""
    counts = ", ".join(f"{n} {state}" for state, n in sorted(array["states"].items(), key=_state_order))
    indices = array["indices"].split("%")[0]
    return (f"{array['id']}{indices}", array["user"], _array_state(array["states"]), array["queue"], "-", counts,
            _clip(array["name"] + indices, 24), when(array["submit_time"]))


_ORDER = ("RUN", "DISP", "USUSP", "SSUSP", "PEND", "PSUSP", "EXIT", "DONE")


def _state_order(item: tuple[str, int]) -> int:
    return _ORDER.index(item[0]) if item[0] in _ORDER else len(_ORDER)


def _array_state(states: dict[str, int]) -> str:
    return next((s for s in _ORDER if states.get(s)), "DONE")


def _pending_groups(jobs: list[dict]) -> list[tuple[dict, dict, dict]]:
    """Runs of an array's consecutive pending elements that wait for the same reason, as one line each."""
    groups: list[list[dict]] = []
    for job in jobs:
        last = groups[-1][-1] if groups else None
        if (last is not None and job.get("array_id") is not None and job["array_id"] == last.get("array_id")
                and (job["pend_reason"], job["state"], job.get("queued_behind"))
                == (last["pend_reason"], last["state"], last.get("queued_behind"))):
            groups[-1].append(job)
        else:
            groups.append([job])
    return [(g[0], g[-1], g[0]) for g in groups]


def _long_array(array: dict) -> str:
    counts = ", ".join(f"{n} {state}" for state, n in sorted(array["states"].items(), key=_state_order))
    return (f"Array <{array['id']}>, Job Name <{array['name']}{array['indices']}>, User <{array['user']}>, "
            f"Queue <{array['queue']}>\n  Elements: {array['size']} ({counts})\n  Submitted: "
            f"{when(array['submit_time'])}\n  Each element: xce jobs -l --elements {array['id']}\n")


def _long(job: dict) -> str:
    if "command" in job:
        shown = [f"  Command: {json.dumps(job['command'], ensure_ascii=False)}",
                 f"  Working directory: {job['cwd']}",
                 f"  Output: {job['stdout']}" + (f"   Error: {job['stderr']}" if job["stderr"] else "")]
    else:  # another user's job on a shared cluster with `visibility: summary`
        shown = ["  Command, working directory, output and environment: shown to its owner and the admins only"]
    lines = [f"Job <{display(job)}>, Job Name <{job['name']}>, User <{job['user']}>, Queue <{job['queue']}>, "
             f"Status <{job['state']}>",
             *shown,
             f"  Slots: {job['slots']}" + (f"   Run limit: {format_duration(job['run_limit'])}"
                                           if job["run_limit"] else "")
             + (f"   Memory limit: {format_size(job['mem_limit'])}" if job["mem_limit"] else ""),
             f"  Submitted: {when(job['submit_time'])}"]
    if job.get("project"):
        lines.append(f"  Project: {job['project']}")
    if job.get("app"):
        lines.append(f"  Application: {job['app']}")
    if job.get("depend"):
        on_fail = "; pends if it can never be satisfied" if job.get("on_dep_fail") == "pend" else ""
        lines.append(f"  Dependency: {job['depend']}{on_fail}")
    if job.get("retry") or job.get("retries"):
        lines.append(f"  Attempt: {job['attempt']}   Retries: {job['retries']}" +
                     (f" of {job['retry']}" if job.get("retry") is not None else ""))
    lines.extend(f"  Pending: {why}" for why in waits(job))
    if job.get("fairshare"):
        lines.append(f"  Fair share: {fair_share_line(job['fairshare'])}")
    if job.get("effective"):
        lines.append("  Effective values [where from]:")
        lines.extend(effective_lines(job["effective"]))
    elif job.get("effective_problem"):
        lines.append(f"  Effective values: cannot run as configured now: {job['effective_problem']}")
    if job["hosts"]:
        lines.append(f"  Hosts: {' '.join(f'{n}*{h}' for h, n in job['hosts'])}   Unit: {job['unit']}")
    if job["start_time"]:
        lines.append(f"  Started: {when(job['start_time'])}")
    if job["end_time"]:
        lines.append(f"  Ended: {when(job['end_time'])}   {outcome(job)}")
        if job["cpu_time"] is not None:
            lines.append(f"  CPU time: {job['cpu_time']:.2f} s   Max memory: {format_size(job['max_rss'] or 0)}")
    elif job["reason"]:
        lines.append(f"  Reason: {job['reason']}")
    if len(job.get("history") or ()) > 1:
        lines.append("  History:")
        lines.extend(f"    {when(e['time'])}  {e['kind']}{_event_detail(e)}" for e in job["history"])
    return "\n".join(lines) + "\n"


def _event_detail(event: dict) -> str:
    """What an event says in a few words: the attempt and hosts of a dispatch, why a requeue."""
    data = event.get("data") or {}
    if event["kind"] == "dispatched":
        return (f": attempt {data.get('attempt')} on {' '.join(f'{n}*{h}' for h, n in data.get('hosts') or [])}"
                + (f", {data['queued']}" if data.get("queued") else ""))  # a queued successor (prefill)
    if event["kind"] == "finished":
        return f": {data.get('state')}" + (f", exit code {data['exit_code']}" if data.get("exit_code") is not None
                                          else "")
    if event["kind"] == "host_hooks":  # a host that ended after the job: its host hooks' outcome
        return f": on {data.get('host')}, " + (data["note"] if data.get("note") else
                                              f"{len(data.get('hooks') or ())} ran, all ok")
    return f": {data['reason']}" if data.get("reason") else ""


def fair_share_line(fs: dict) -> str:
    """`xce why` and `xce jobs -l`: an entity's standing in its queue's fair share."""
    return (f"{fs['by']} {fs['entity'] or '-'} in queue {fs['queue']}: share {fs['share']:g}, usage "
            f"{fs['usage_slot_hours']:g} slot-hours (decayed), {fs['running_slots']:g} slots running, "
            f"priority {fs['priority']:.4g}")


def outcome(job: dict) -> str:
    if job["exit_signal"]:
        text = f"killed by signal {job['exit_signal']}"
    elif job["exit_code"] is not None:
        text = f"exit code {job['exit_code']}"
    else:
        text = "no exit code"
    return text + (f": {job['reason']}" if job["reason"] else "")


def _clip(text: str, width: int) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%b %d %H:%M:%S", time.localtime(stamp))


def _table(rows: Sequence[Sequence[str]]) -> None:
    for line in table_lines(rows):
        click.echo(line)
