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
        "state": job.state,
        "slots": sum(n for _, n in job.hosts) if job.hosts else job.spec.slots,  # placed, or the minimum
        "min_slots": job.spec.slots,
        "max_slots": job.spec.max_slots or job.spec.slots,
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
    }
