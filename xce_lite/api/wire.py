"""The JSON shape of a job in API replies and `xce jobs --json` (schema 1; add fields, never rename).

Standard library only: the CLI formats these dicts without importing the models it came from.
"""

from __future__ import annotations

from typing import Any

from xce_lite.models import Job

SCHEMA = 1


def job_to_wire(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "user": job.user,
        "queue": job.queue,
        "project": job.project,  # its project's path (None: submitted before projects existed)
        "state": job.state,
        # placed, or the minimum; the API puts the effective counts here (a profile may set them)
        "slots": sum(n for _, n in job.hosts) if job.hosts else job.spec.slots or 1,
        "min_slots": job.spec.slots or 1,
        "max_slots": job.spec.max_slots or job.spec.slots or 1,
        "resreq": list(job.spec.resreq),
        "command": list(job.spec.argv),
        "cwd": job.spec.cwd,
        "stdout": job.output_path(),
        "stderr": job.error_path(),
        "run_limit": job.spec.run_limit,
        "mem_limit": job.spec.mem_limit,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "attempt": job.attempt,
        "hosts": [[h, n] for h, n in job.hosts],
        "unit": job.unit,
        "exit_code": job.exit_code,
        "exit_signal": job.exit_signal,
        "cpu_time": job.cpu_time,
        "max_rss": job.max_rss,
        "reason": job.reason,
        "pend_reason": job.pend_reason,
        "app": job.spec.app or "",  # the application profile ("": none)
        "app_params": dict(job.spec.app_params),  # the job's own values; effective ones in `effective`
        "meta": job.spec.meta,  # client data (the preset used), passed through
        # workflows: an element's array and index ("display_id": 42[7]), the dependency as written,
        # retries asked for and used
        "display_id": job.display_id,
        "array_id": job.array_id,
        "array_index": job.array_index,
        "array": job.spec.array,
        "depend": job.spec.depend,
        "on_dep_fail": job.spec.on_dep_fail,
        "retry": job.spec.retry,
        "retries": job.retries,
    }
