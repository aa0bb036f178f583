"""The merge's values as rows for people: `xce jobs -l`, `xce why`, `xce apps -l`, and the list of
what a reconfig changes. Pure; the rows' field names are stable (tests and tools read them).
"""

from __future__ import annotations

from dataclasses import replace

from xce_lite.config.merge import task_range
from xce_lite.config.merge_values import DEFAULT, DEFAULT_HOOK_TIMEOUT, JOB, PROFILE, Effective, Hook, Profile
from xce_lite.quantities import format_duration, format_size
from xce_lite.sched import resreq as rr


def describe(eff: Effective) -> list[tuple[str, str, str]]:
    """(field, value, origin) rows for `xce jobs -l`, `xce why` and `xce apps -l`, in a fixed order."""
    o = eff.origins
    rows = [("application", f"{eff.app} (hash {eff.profile_hash})" if eff.app else "none", o.get("app", DEFAULT)),
            ("tasks", task_range(eff.min_tasks, eff.max_tasks), o.get("tasks", DEFAULT))]
    r = eff.resreq
    if r.select is not None:
        rows.append(("select", rr.format_expr(r.select), o.get("select", JOB)))
    rows.extend((f"rusage {t.name}", rr.format_term(t).partition("=")[2] + ("/task" if t.per == "task" else ""),
                 o.get(f"rusage:{t.name}", JOB)) for t in r.rusage)
    if r.span is not None:
        rows.append(("span", rr.format_span(r.span), o.get("span", JOB)))
    if r.same:
        rows.append(("same", ":".join(r.same), o.get("same", JOB)))
    if r.order:
        rows.append(("order", ":".join(rr.format_key(k) for k in r.order), o.get("order", JOB)))
    rows.append(("run limit", format_duration(eff.run_limit) if eff.run_limit else "none",
                 o.get("run_limit", DEFAULT)))
    rows.append(("memory limit", format_size(eff.mem_limit) if eff.mem_limit else "none",
                 o.get("mem_limit", DEFAULT)))
    rows.extend((f"env {name}", value, PROFILE) for name, value in eff.profile_env.items())  # the job's own on top
    rows.extend((f"param {name}", value, o.get(f"param:{name}", PROFILE)) for name, value in eff.params.items())
    rows.extend((f"annotation {name}", value, PROFILE) for name, value in eff.annotations.items())
    rows.extend((f"hook {point}", _hook_text(h), PROFILE) for point, h in eff.hooks.items())
    rows.extend((f"job hook {point}", h.argv[-1], o.get("job_hooks", JOB)) for point, h in eff.job_hooks.items())
    if eff.hooks or eff.job_hooks:
        rows.append(("post hook failure", eff.post_failure, PROFILE))
    if eff.job_starter:
        rows.append(("job starter", " ".join(eff.job_starter), PROFILE))
    if eff.app:
        rows.append(("mode, launch", f"{eff.mode}, {eff.launch}", PROFILE))
    if eff.retry:
        codes = ",".join(map(str, eff.retry_on)) if eff.retry_on else "any failure"
        rows.append(("retries", f"{eff.retry} on {codes}", o.get("retry", DEFAULT)))
    return rows


def changed_fields(before: Effective | None, after: Effective | None) -> list[str]:
    """The fields whose value or origin differs (`describe`'s names); for reconfig and xceadmin check."""
    old = {f: (v, o) for f, v, o in describe(before)} if before is not None else {}
    new = {f: (v, o) for f, v, o in describe(after)} if after is not None else {}
    return sorted(f for f in old.keys() | new.keys() if old.get(f) != new.get(f))


def describe_profile(p: Profile) -> list[tuple[str, str]]:
    """(field, value) rows of a profile as `xce apps -l` shows it."""
    r = p.resources
    tasks = f"{p.min_tasks or 1}..{p.max_tasks if p.max_tasks is not None else 'any'}"
    rows = [("kind, mode, launch", f"{p.kind}, {p.mode}, {p.launch}"),
            ("tasks", tasks + (f" (default {p.default_tasks or p.min_tasks})" if p.default_tasks or p.min_tasks
                               else ""))]
    if r.select is not None:
        rows.append(("select", rr.format_expr(r.select)))
    for e in r.rusage:
        if e.default is None:
            rows.append((f"rusage {e.name}", f"required, per {e.per}"))
        else:
            amount = rr.format_term(replace(e.default, per="task")).partition("=")[2]
            rows.append((f"rusage {e.name}", f"{amount} per {e.per} (default)"))
    if r.span is not None:
        rows.append(("span", rr.format_span(r.span)))
    if r.same:
        rows.append(("same", ":".join(r.same)))
    if r.order:
        rows.append(("order", ":".join(rr.format_key(k) for k in r.order)))
    if p.run_limit:
        rows.append(("run limit", f"{format_duration(p.run_limit)} at most"))
    if p.mem_limit:
        rows.append(("memory limit", f"{format_size(p.mem_limit)} at most"))
    rows.extend((f"env {name}", value) for name, value in p.env.items())
    rows.extend((f"param {q.name}", (q.default if q.default is not None else "(no default)")
                 + (f"  - {q.description}" if q.description else "")) for q in p.params)
    rows.extend((f"annotation {name}", value) for name, value in p.annotations.items())
    if p.retry is not None:
        rows.append(("retries", f"{p.retry} at most, on " + (",".join(map(str, p.retry_on)) if p.retry_on
                                                             else "any failure")))
    rows.extend((f"hook {point}", _hook_text(h)) for point, h in p.hooks.items())
    if p.hooks or not p.job_hooks:
        rows.append(("job hooks (-E, -Ep)", "allowed" if p.job_hooks else "refused"))
    if p.hooks:
        rows.append(("post hook failure", p.post_failure))
    if p.job_starter:
        rows.append(("job starter", " ".join(p.job_starter)))
    return rows


def _hook_text(h: Hook) -> str:
    return (" ".join(h.argv) + f"  (timeout {format_duration(h.timeout or DEFAULT_HOOK_TIMEOUT)}"
            + (", as root)" if h.as_root else ")"))
