"""The store's reads for projects and fair share: jobs per project and state, and the past usage
fair share decays. JobStore inherits them (`ProjectStore`).

Usage is read through `fairshare_usage` alone, so that where it comes from can change in one place:
today the finished jobs' rows (start, end, slots, GPUs); once retention moves old jobs out of the
live table, the per-day aggregates it keeps join here (each a day's slot- and GPU-seconds, counted
as used at the day's middle).
"""

from __future__ import annotations

import apsw

from xce_lite.models import FINISHED_STATES
from xce_lite.store.job_reads import UNFINISHED  # the jobs_unfinished index's condition (sql/0013)

_FINISHED = tuple(sorted(FINISHED_STATES))
# the slots a placed job held, and its GPUs (the indices its allocations got)
_SLOTS = "coalesce((SELECT sum(json_extract(h.value, '$[1]')) FROM json_each(jobs.hosts) AS h), jobs.slots)"
_GPUS = "coalesce((SELECT sum(json_array_length(a.value, '$[3]')) FROM json_each(jobs.alloc, '$.allocs') AS a), 0)"


class ProjectStore:
    def _reader(self) -> apsw.Connection:  # provided by JobStore
        raise NotImplementedError

    def fairshare_usage(self, since: float) -> list[tuple[str, str | None, float, float, int, int]]:
        """(user, project, start, end, slots, gpus) of every job that ran and finished at or after
        `since`, live or archived (store/archive.py keeps these per job for `keep_archived`, far past
        any half life): what fair share decays (sched/fairshare.py). Running jobs are the controller's
        to add."""
        rows = self._reader().execute(
            f"SELECT user, project, start_time, end_time, {_SLOTS}, {_GPUS} FROM jobs "
            f"WHERE state IN (?, ?) AND start_time IS NOT NULL AND end_time >= ? "
            f"UNION ALL SELECT user, project, start_time, end_time, slots, gpus FROM jobs_archive "
            f"WHERE start_time IS NOT NULL AND end_time >= ?", (*_FINISHED, since, since))
        return [(user, project, start, end, int(slots or 0), int(gpus or 0))
                for user, project, start, end, slots, gpus in rows]

    def counts_by_project(self) -> dict[tuple[str | None, str], int]:
        """(project, state) -> number of unfinished jobs."""
        rows = self._reader().execute(
            f"SELECT project, state, count(*) FROM jobs WHERE {UNFINISHED} GROUP BY project, state")
        return {(project, state): n for project, state, n in rows}
