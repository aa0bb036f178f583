"""What a unit's result makes of its job: the Finish to store, or the requeue that retries it. Pure.

DONE only for exit 0, no signal and no reason. A job someone killed is never retried, and if it does
not end DONE it ends with the kill's reason first, whatever ended it (kills.killed_reason): its host
stopped it when the lease ran out before the kill reached it, or it failed on its own meanwhile.
"""

from __future__ import annotations

from xce_lite.controller.kills import killed_reason
from xce_lite.controller.state import Active
from xce_lite.exec.host import JobResult
from xce_lite.models import EXIT
from xce_lite.store.jobs import Finish, Requeue


def retry_of(job: Active, finish: Finish) -> Requeue | None:
    """The requeue that retries a failed attempt (--retry, --retry-on), or None: it succeeded, was
    killed by someone, failed with a code not listed, or has no retries left."""
    if finish.state != EXIT or job.killed or job.retries >= job.retry:
        return None
    if job.retry_on is not None and finish.exit_code not in job.retry_on:
        return None
    how = (f"killed by signal {finish.exit_signal}" if finish.exit_signal else f"exit code {finish.exit_code}")
    if finish.reason:
        how += f": {finish.reason}"
    reason = f"attempt {job.attempt} failed ({how}); retry {job.retries + 1} of {job.retry}"
    result = {"attempt": job.attempt, "exit_code": finish.exit_code, "signal": finish.exit_signal,
              "reason": finish.reason, "start_time": finish.start_time, "end_time": finish.end_time,
              "cpu_time": finish.cpu_time, "max_rss": finish.max_rss}
    return Requeue(job.id, job.state, reason, retry=True, result=result)


def finish_from_result(job: Active, result: JobResult) -> Finish:
    """DONE: exit 0, no signal, no reason. A job someone killed that did not end DONE ends with the
    kill's reason, whatever ended it first (kills.killed_reason: its host stopped it when the lease
    ran out before the kill reached it, it failed). A note (post hooks that failed without failing
    the job) is stored after the reason, whatever the state."""
    ok = result.exit_code == 0 and result.signal is None and result.reason is None
    why = result.reason
    if job.killed and not ok:
        why = killed_reason(job.killed, why or _how_it_ended(result))
    reason = "; ".join(text for text in (why, result.note) if text) or None
    return Finish(job.id, job.state, "DONE" if ok else EXIT, result.start_time, result.end_time, result.exit_code,
                  result.signal, result.cpu_time, result.max_rss, reason, result.hooks)


def _how_it_ended(result: JobResult) -> str:
    """A result with no reason of its own, in words."""
    if result.signal is not None:
        return f"killed by signal {result.signal}"
    return f"exit code {result.exit_code}" if result.exit_code is not None else "exit status unknown"
