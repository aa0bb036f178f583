"""Kill wins: a job someone killed is never requeued, retried or started again, whatever its host does.

The kill is recorded in the store (`kill_requested`, with its reason) before anything is sent, so it
survives a restart; the store itself refuses to requeue such a job (store/jobs.py `_requeue`). Then:

- delivery: a kill mark per job is sent to the job's first host by its host worker (hostops.py),
  never on the tick's thread: the part kill_marks.KillMarks (`Controller.kills`) owns the marks and
  their retries; a dispatch not yet launched never starts (unitwork `_launch`);
- the end: EXIT with the kill's reason once the host reports the unit ended (its result carries
  the reason), or at once when the host is declared lost (`on_lost`): never a requeue; a unit
  that ended otherwise before the kill reached it (its host stopped it when the lease ran out, it
  failed, it vanished) ends the job with the kill's reason too, then how it ended (`killed_reason`);
- after a restart every killed active job is marked again (a second TERM costs nothing; a lost
  first one would let the job run on).

Here are the two decisions, pure (the controller carries them out). Copies on lost hosts: a job
handled as lost leaves its units draining; a copy that still runs when its host answers again is
stopped, and the result of a copy the controller gave up on is recorded as a `host_hooks` event at
most, never as the job's outcome (unitwork `Units.unit_finished`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xce_lite.models import DISP, EXIT
from xce_lite.store.jobs import Finish, Requeue


def killed_reason(kill: str | None, why: str) -> str:
    """The reason a job ends EXIT with when `why` ended it: a job someone killed (`kill`, its
    reason) has the kill's first, then `why` (its host stopped it, lost it, refused it, or it
    failed), unless `why` is the kill's own: the agent words a kill it delivered with its reason."""
    if kill is None or why == kill:
        return why
    return f"{kill} ({why}, before it confirmed the kill)"


def on_lost(job: Any, why: str, on_host_lost: str) -> Requeue | str:
    """What a host declared lost does to active job `job`: the Requeue to store, or the reason it
    ends EXIT with (killed, the kill's reason; else as `controller.on_host_lost` says)."""
    if job.killed:
        return killed_reason(job.killed, why)
    if on_host_lost == "requeue":
        return Requeue(job.id, job.state, why)
    return why


def kill_wins(active: Mapping[int, Any], requeues: list[Requeue], finishing: list[tuple[Finish, str]],
              now: float) -> list[Requeue]:
    """The requeues to store, less those of jobs killed since they were decided, which end
    EXIT instead (appended to `finishing`). The store refuses them too; this gives them their
    event and their place in memory. Holds _mu."""
    kept = []
    for r in requeues:
        job = active.get(r.job_id)
        if job is None or not job.killed:
            kept.append(r)
            continue
        start = None if job.state == DISP else now
        finishing.append((Finish(job.id, r.from_state, EXIT, start, now, None, None, None, None,
                                 f"{job.killed} (not requeued: {r.reason})"), "finished"))
    return kept
