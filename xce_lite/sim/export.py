"""`xce sim export`: a live store's history as a workload, so a lab can replay its own past.

Every job that ran to an end (DONE or EXIT with a start time) becomes one workload job: submitted
when it was (seconds after the first one exported), by its user, to its queue, with its profile,
task range, -R, limits and priority, running as long as it ran and ending with its exit code
(a job killed by a signal exports exit 1, and its run as it was), and its `-w` as written. An array's
elements export as jobs of their own (its throttle is not carried over). Jobs still pending or
running, and jobs killed before they started, have no runtime yet and are left out. Read-only.
"""

from __future__ import annotations

from pathlib import Path

from xce_lite.models import DONE, EXIT


def export_workload(store_path: Path, out: Path, since: float | None = None) -> int:
    """Write the workload YAML to `out` (whole, or not at all); the number of jobs written."""
    import yaml

    from xce_lite.store.jobs import JobStore

    store = JobStore(store_path, readonly=True)
    try:
        jobs = [j for j in store.jobs(include_finished=True) if j.state in (DONE, EXIT) and j.start_time is not None
                and j.end_time is not None and (since is None or j.submit_time >= since)]
    finally:
        store.close()
    jobs.sort(key=lambda j: (j.submit_time, j.id))
    origin = jobs[0].submit_time if jobs else 0.0
    rows = []
    for j in jobs:
        s = j.spec
        assert j.start_time is not None and j.end_time is not None  # only such jobs were kept
        row: dict = {"submit": round(j.submit_time - origin, 3), "user": j.user, "queue": j.queue,
                     "runtime": round(max(j.end_time - j.start_time, 0.0), 3),
                     "exit": j.exit_code if j.exit_code is not None else 1}
        if s.app is not None:
            row["app"] = s.app if s.exdata.get("app_origin") != "default" else None
        if row.get("app") is None:
            row.pop("app", None)
        if s.slots is not None:
            row["n"] = f"{s.slots},{s.max_slots}" if s.max_slots else str(s.slots)
        if s.resreq:
            row["R"] = s.resreq[0] if len(s.resreq) == 1 else list(s.resreq)
        if s.name:
            row["name"] = s.name
        if s.project is not None:  # the project it ran in (resolved at submit)
            row["project"] = s.project
        if s.priority:
            row["priority"] = s.priority
        if s.run_limit is not None:
            row["W"] = f"{s.run_limit:g}s"
        if s.mem_limit is not None:
            row["M"] = f"{s.mem_limit}b"
        if s.depend:  # as written: names resolve again at the simulated submit, as they did at the real one
            row["after"] = s.depend
        rows.append(row)
    partial = out.with_name(out.name + ".partial")
    partial.write_text("# exported by `xce sim export`: times in seconds after the first job's submit\n"
                       + yaml.safe_dump({"jobs": rows}, sort_keys=False), encoding="utf-8")
    partial.replace(out)
    return len(rows)
