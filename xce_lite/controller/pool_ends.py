"""A unit's end on a Slurm allocation's host that nothing of ours explains, held until Slurm says
whether the allocation still runs.

When Slurm ends an allocation (scancel, its time limit, a node's failure) it signals every process in
it: a job dies of SIGTERM or SIGKILL, its supervisor records that end, and the node's agent may still
report it before it dies itself. Counted at once, that end would end the job EXIT, where the
allocation's end makes its hosts lost and the job is requeued (pools.py, `_pool_end`), as LSF
requeues a job whose host failed. So an end by a signal with no reason of ours (no kill, no run
limit: the supervisor words those otherwise) waits for an squeue asked after it arrived:
- the allocation still runs: the end counts as it is (someone else signalled the job);
- it ended: the pool's end has requeued the job; the held end is dropped.

Invariants: a held end is in memory only; the host's journal keeps the result until the controller
forgets the unit, and nothing forgets a held one, so a restarted controller hears it again (adoption)
and holds it again. While Slurm does not answer, HOLD_MAX bounds the wait: then the end counts as it
is, as it did before this hold existed. Ends that pools.py reads from a dead allocation's journal
never pass through here (their allocation is no longer running).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xce_lite.exec.host import JobResult
from xce_lite.exec.slurmhost import results_on_disk

HOLD_MAX = 30.0  # seconds an end waits for Slurm's word before it counts as it is
SIGNALLED = "killed by signal "  # how the supervisor (watch.py) and systemd.py word a signal nobody explained


@dataclass(frozen=True)
class HeldEnd:
    pool: str
    host: str
    unit: str
    result: JobResult
    since: float  # when it arrived (the controller's clock, as an squeue's `began`)


def unexplained_signal(result: JobResult, killed: str | None) -> bool:
    """True if `result` is a death by a signal that nobody of ours sent: no kill of the job
    (`killed`), no reason of the supervisor's own (a run limit, a kill it delivered): only the one it
    words every other signal's end with ("killed by signal SIGTERM"), or none."""
    return result.signal is not None and not killed and (not result.reason or result.reason.startswith(SIGNALLED))


class PoolEnds:
    """See the module docstring. `running_pool(host)`: the pool whose running allocation `host`
    belongs to, else None; `count(host, unit, result, now)`: the units' part taking an end (holds the
    state's lock, as `hold` is called with it held); `poll_soon(pool)`: ask Slurm at the next step."""

    def __init__(self, running_pool: Callable[[str], str | None],
                 count: Callable[[str, str, JobResult, float], None], poll_soon: Callable[[str], None],
                 log: Callable[[str], None] = lambda _line: None) -> None:
        self.running_pool, self.count, self.poll_soon, self.log = running_pool, count, poll_soon, log
        self.held: dict[str, HeldEnd] = {}  # by unit
        self._counting = False

    def hold(self, host: str, unit: str, job: Any, result: JobResult, now: float) -> bool:
        """True if the end of `unit` (of active `job`) on `host` waits for Slurm's word (see the
        module docstring); the caller then takes it no further. Holds the state's lock."""
        if self._counting or not unexplained_signal(result, job.killed):
            return False
        pool = self.running_pool(host)
        if pool is None:
            return False
        if unit not in self.held:
            self.held[unit] = HeldEnd(pool, host, unit, result, now)
            self.poll_soon(pool)
            self.log(f"pool {pool}: unit {unit} on {host} ended by signal {result.signal}, sent by none of ours; "
                     "its end counts once Slurm says the allocation still runs (else its job is requeued)")
        return True

    def answered(self, pool: str, began: float, now: float) -> None:
        """An squeue of `pool` asked at `began` has been applied (allocations that ended have
        ended, their jobs requeued): the ends held before it are counted where their allocation
        still runs, dropped where it ended. Holds the state's lock."""
        for end in [e for e in self.held.values() if e.pool == pool and e.since < began]:
            del self.held[end.unit]
            if self.running_pool(end.host) == pool:
                self._count(end, now)

    def expire(self, now: float) -> None:
        """Ends held past HOLD_MAX (Slurm silent) count as they are. Holds the state's lock."""
        for end in [e for e in self.held.values() if now - e.since > HOLD_MAX]:
            del self.held[end.unit]
            self._count(end, now)

    def _count(self, end: HeldEnd, now: float) -> None:
        self._counting = True
        try:
            self.count(end.host, end.unit, end.result, now)
        finally:
            self._counting = False


def late_results(directory: str | os.PathLike[str], job_id: str, node_of: dict[str, str], names: list[str],
                 ended_at: float) -> dict[tuple[str, str], JobResult]:
    """{(host, unit): result} of the units on hosts `names` (of allocation `job_id`, whose host ->
    node is `node_of`) that ended before `ended_at`, by their nodes' journals in the pool's
    `directory`: their reports died with the relay, they count. A unit Slurm's end killed ends
    later (or never records): not counted, its job is requeued."""
    out = {}
    for name in names:
        node = node_of.get(name)
        for unit, result in (results_on_disk(directory, job_id, node).items() if node is not None else ()):
            if result.end_time is not None and result.end_time < ended_at:
                out[(name, unit)] = result
    return out
