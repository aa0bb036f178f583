"""What each dashboard page shows, as plain dicts for its template, built from API replies.

Only what the API returns is shown: a field the controller leaves out (a command line another
user's job hides, in a shared home) is shown as hidden, never looked up elsewhere. No page shows a
job's environment (the API never returns one).
"""

from __future__ import annotations

import base64
import fnmatch
import time
from collections import defaultdict
from typing import Any

from xce_lite import errors
from xce_lite.quantities import format_duration, format_size
from xce_lite.web.flowgraph import layout
from xce_lite.web.source import Source

STATES = ("PEND", "PSUSP", "DISP", "RUN", "USUSP", "SSUSP", "DONE", "EXIT")
TAIL_BYTES = 64 * 1024  # the end of a job's output the job page shows
_FAR = 1 << 53  # an offset past any file's end: the agent answers with the file's size only


def when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def amount(resource: str, value: float) -> str:
    if resource == "mem":
        return format_size(int(value)) if value > 0 else "0"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def why(job: dict) -> str:
    if job["state"] == "PSUSP":
        return job.get("reason") or "held"
    return job.get("pend_reason") or "not scheduled yet"


# ---- overview ------------------------------------------------------------------------------------


def overview(source: Source, hours: float) -> dict[str, Any]:
    status = source.get("/status")
    metrics = source.get("/metrics")
    by_queue: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATES[:6], 0))
    totals = dict.fromkeys(STATES[:6], 0)
    for row in metrics["jobs"]:
        by_queue[row["queue"]][row["state"]] = row["count"]
        totals[row["state"]] += row["count"]
    usage = source.cached(10, "/usage", hours=hours)
    return {"status": status, "queues": dict(sorted(by_queue.items())), "totals": totals,
            "reasons": {k: n for k, n in metrics["pending_reasons"].items() if n},
            "hosts": [host_row(h) for h in source.get("/hosts")["hosts"]], "usage": usage, "hours": hours}


def host_row(h: dict) -> dict[str, Any]:
    """A host with its slots, memory and GPUs as used of total (and its other resources)."""
    meters = []
    for name in ("slots", "mem", "gpus", *sorted(set(h["resources"]) - {"slots", "mem", "gpus"})):
        r = h["resources"].get(name)
        if r is None or (name == "gpus" and not r["total"]):
            continue
        used = r["total"] - r["free"]
        meters.append({"name": name, "used": amount(name, used), "total": amount(name, r["total"]),
                       "percent": round(100 * used / r["total"]) if r["total"] else 0})
    agent = h.get("agent") or {}
    state = "lost" if h.get("lost") else h["state"]
    return {"name": h["name"], "type": h["type"], "state": state, "since": when(h.get("unreach_since")),
            "why": h.get("unreach_why"), "mode": agent.get("mode") or "-", "jobs": h["jobs"], "meters": meters,
            "agent": agent, "attrs": h.get("attrs") or {}, "tags": h.get("tags") or []}


# ---- jobs ----------------------------------------------------------------------------------------

FILTERS = ("user", "queue", "state", "project", "name", "finished")


def jobs(source: Source, filters: dict[str, str], limit: int = 500) -> dict[str, Any]:
    """Jobs and arrays matching the filters: user (default: you; `all`), queue, state, project,
    name (a glob: `sim*`), finished (1: finished ones too). Newest first, at most `limit`."""
    user = filters.get("user") or None
    reply = source.get("/jobs", user=user or None, all=filters.get("finished") == "1")
    rows = [_job_row(j) for j in reply["jobs"]] + [_array_row(a) for a in reply["arrays"]]
    has_projects = any(r["project"] for r in rows)
    for key in ("queue", "state", "project"):
        if filters.get(key):
            rows = [r for r in rows if r[key] == filters[key] or (key == "state" and filters[key] in r["states"])]
    if filters.get("name"):
        pattern = filters["name"] if any(c in filters["name"] for c in "*?[") else f"*{filters['name']}*"
        rows = [r for r in rows if fnmatch.fnmatchcase(r["name"], pattern)]
    rows.sort(key=lambda r: r["id"], reverse=True)
    return {"rows": rows[:limit], "shown": min(limit, len(rows)), "matched": len(rows), "filters": filters,
            "has_projects": has_projects}


def _job_row(j: dict) -> dict[str, Any]:
    hosts = " ".join(f"{n}*{h}" if n > 1 else h for h, n in j["hosts"]) or "-"
    waiting = j["state"] in ("PEND", "PSUSP")
    return {"id": j["id"], "ref": j.get("display_id") or str(j["id"]), "user": j["user"], "queue": j["queue"],
            "state": j["state"], "states": {j["state"]: 1}, "project": j.get("project") or "",
            "name": j["name"] + (f"[{j['array_index']}]" if j.get("array_index") else ""), "slots": j["slots"],
            "hosts": hosts, "submitted": when(j["submit_time"]), "why": why(j) if waiting else "",
            "outcome": outcome(j) if j["state"] == "EXIT" else ""}


def _array_row(a: dict) -> dict[str, Any]:
    order = ("RUN", "DISP", "USUSP", "SSUSP", "PEND", "PSUSP", "EXIT", "DONE")
    state = next((s for s in order if a["states"].get(s)), "DONE")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(a["states"].items(), key=lambda i: order.index(i[0])))
    indices = a["indices"].split("%")[0]
    return {"id": a["id"], "ref": str(a["id"]), "user": a["user"], "queue": a["queue"], "state": state,
            "states": a["states"], "project": a.get("project") or "", "name": a["name"] + indices, "slots": "-",
            "hosts": counts, "submitted": when(a["submit_time"]), "why": "", "outcome": "", "array": True}


def outcome(job: dict) -> str:
    if job.get("exit_signal"):
        text = f"killed by signal {job['exit_signal']}"
    elif job.get("exit_code") is not None:
        text = f"exit code {job['exit_code']}"
    else:
        text = "no exit code"
    return text + (f": {job['reason']}" if job.get("reason") else "")


# ---- one job ---------------------------------------------------------------------------------------


def job(source: Source, ref: str) -> dict[str, Any]:
    reply = source.get("/jobs", ids=ref, effective=True, history=True)
    if not reply["jobs"] and reply["arrays"]:
        array = reply["arrays"][0]
        elements = source.get("/jobs", ids=ref, elements=True)["jobs"]
        return {"array": _array_row(array), "elements": [_job_row(j) for j in elements]}
    if not reply["jobs"]:
        raise errors.NotFound(f"no such job: {ref}")
    j = reply["jobs"][0]
    page: dict[str, Any] = {"job": j, "row": _job_row(j), "history": [_event(e) for e in j.get("history") or ()],
                            "fields": _fields(j), "effective": j.get("effective") or [],
                            "effective_problem": j.get("effective_problem")}
    if j["state"] == "PEND":
        page["why"] = _why(source, page["row"]["ref"])
    page["tail"] = tail(source, j["id"]) if j["hosts"] else _no_tail("no output yet: it has not started")
    return page


def _fields(j: dict) -> list[tuple[str, str]]:
    command = j.get("command")
    rows = [("user", j["user"]), ("queue", j["queue"]), ("name", j["name"]),
            ("command", " ".join(command) if command is not None else "(hidden)"),
            ("working directory", j.get("cwd") or "(hidden)"), ("output", j.get("stdout") or "-")]
    if j.get("stderr"):
        rows.append(("error file", j["stderr"]))
    rows += [("slots", str(j["slots"])), ("submitted", when(j["submit_time"])), ("started", when(j["start_time"])),
             ("ended", when(j["end_time"]))]
    if j.get("run_limit"):
        rows.append(("run limit", format_duration(j["run_limit"])))
    if j.get("mem_limit"):
        rows.append(("memory limit", format_size(j["mem_limit"])))
    if j["hosts"]:
        rows.append(("hosts", " ".join(f"{n}*{h}" for h, n in j["hosts"])))
        rows.append(("unit", j.get("unit") or "-"))
    if j.get("depend"):
        rows.append(("dependency", j["depend"]))
    if j.get("app"):
        rows.append(("application", j["app"]))
    if j.get("retry") or j.get("retries"):
        rows.append(("attempt", f"{j['attempt']} (retries {j['retries']} of {j.get('retry') or 0})"))
    if j["state"] in ("DONE", "EXIT"):
        rows.append(("outcome", outcome(j)))
        if j.get("cpu_time") is not None:
            rows.append(("cpu time", f"{j['cpu_time']:.2f} s"))
            rows.append(("max memory", format_size(j.get("max_rss") or 0)))
    elif j["state"] in ("PEND", "PSUSP"):
        rows.append(("waiting", why(j)))
    return rows


def _event(e: dict) -> dict[str, str]:
    data = e.get("data") or {}
    if e["kind"] == "dispatched":
        detail = f"attempt {data.get('attempt')} on " + " ".join(f"{n}*{h}" for h, n in data.get("hosts") or [])
    elif e["kind"] == "finished":
        detail = str(data.get("state") or "") + (f", exit code {data['exit_code']}"
                                                 if data.get("exit_code") is not None else "")
    else:
        detail = str(data.get("reason") or data.get("note") or data.get("by") or "")
    return {"time": when(e["time"]), "kind": e["kind"], "detail": detail}


def _why(source: Source, ref: str) -> dict[str, Any]:
    try:
        reply = source.get("/jobs/why", id=ref)
    except (errors.TransitionError, errors.NotFound) as err:  # not the caller's job: its reason only
        return {"summary": "", "lines": [], "note": str(err)}
    return {"summary": reply.get("summary") or "", "lines": reply.get("lines") or [], "note": ""}


def _no_tail(note: str) -> dict[str, str]:
    return {"text": "", "note": note, "path": "", "host": ""}


def tail(source: Source, job_id: int) -> dict[str, str]:
    """The last TAIL_BYTES of the job's output, read on its first host through its agent."""
    try:
        probe = source.get("/jobs/peek", id=job_id, offset=_FAR)
        if probe.get("message"):
            return _no_tail(probe["message"])
        start = max(0, probe.get("size", 0) - TAIL_BYTES)
        reply = source.get("/jobs/peek", id=job_id, offset=start)
    except (errors.TransitionError, errors.HostUnreachable, errors.SpecError) as err:
        return _no_tail(str(err))
    text = base64.b64decode(reply["data_b64"]).decode("utf-8", errors="replace")
    note = f"the last {TAIL_BYTES // 1024} KiB of {reply['size']} bytes" if start else ""
    return {"text": text, "note": note, "path": reply.get("path", ""), "host": reply.get("host", "")}


# ---- hosts, flows, accounting ------------------------------------------------------------------------


def hosts(source: Source) -> dict[str, Any]:
    rows = [host_row(h) for h in source.get("/hosts")["hosts"]]
    running: dict[str, list[dict]] = defaultdict(list)
    for j in source.get("/jobs", user="all", elements=True)["jobs"]:
        for host, tasks in j["hosts"]:
            running[host].append({"ref": j.get("display_id") or str(j["id"]), "user": j["user"],
                                  "state": j["state"], "tasks": tasks, "name": j["name"]})
    for row in rows:
        row["running"] = running.get(row["name"], [])
    return {"hosts": rows}


def flows(source: Source) -> dict[str, Any]:
    rows = source.get("/flows/list")["flows"]
    return {"flows": [{**f, "submitted": when(f["submit_time"])} for f in rows]}


def flow(source: Source, name: str) -> dict[str, Any]:
    f = source.get("/flows", name=name)["flow"]
    return {"flow": f, "submitted": when(f["submit_time"]), "graph": layout(f["steps"])}


def accounting(source: Source, days: float) -> dict[str, Any]:
    reply = source.cached(30, "/accounting", days=days)
    users: dict[str, dict[str, float]] = defaultdict(lambda: {"jobs": 0, "done": 0, "exit": 0, "slot_hours": 0.0,
                                                              "cpu_hours": 0.0})
    queues: dict[str, dict[str, float]] = defaultdict(lambda: {"jobs": 0, "slot_hours": 0.0})
    for row in reply["rows"]:
        u = users[row["user"]]
        for key in ("jobs", "done", "exit", "slot_hours", "cpu_hours"):
            u[key] += row[key]
        queues[row["queue"]]["jobs"] += row["jobs"]
        queues[row["queue"]]["slot_hours"] += row["slot_hours"]
    return {"rows": reply["rows"], "users": dict(sorted(users.items())), "queues": dict(sorted(queues.items())),
            "days": days, "chart": _daily_chart(reply["rows"])}


def _daily_chart(rows: list[dict]) -> dict[str, Any]:
    """{"days": [...], "series": {user: [slot-hours per day]}} for the accounting chart."""
    days = sorted({r["day"] for r in rows})
    series: dict[str, list[float]] = {}
    for r in rows:
        series.setdefault(r["user"], [0.0] * len(days))[days.index(r["day"])] += r["slot_hours"]
    return {"days": days, "series": dict(sorted(series.items()))}
