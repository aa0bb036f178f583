"""The store's reads for seeing the cluster over time: utilisation and queue length in the last
hours, usage per user and queue per day, and a user's flows. JobStore inherits them (`UsageStore`).

What the store has is one row per job with its submit, start and end times and its slots (the tasks
it was placed with, else the count it asked for): a job requeued keeps only its last attempt's start,
so an earlier attempt's run is not counted, and a dispatched job not started yet counts as waiting.
Usage per day counts finished jobs by the day they ended (the controller's local time): slot-hours
are (end - start) x slots, cpu-hours the cpu time the hosts reported; archived jobs count by their
day sums (usage_daily). Until projects exist (issue 17), usage is by user and queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import apsw

from xce_lite.models import FINISHED_STATES

_FINISHED = tuple(sorted(FINISHED_STATES))
MAX_POINTS = 2000  # a series longer than this is refused: the caller picks a longer step
# the slots a job holds: the tasks of its placement, else (never placed) the count it asked for
_SLOTS = "coalesce((SELECT sum(json_extract(h.value, '$[1]')) FROM json_each(jobs.hosts) AS h), jobs.slots)"
SLOTS = _SLOTS
# the GPUs it held: the indices its allocation gave it on each host (none before schema 2)
GPUS = ("coalesce((SELECT sum(json_array_length(a.value, '$[3]')) FROM json_each(jobs.alloc, '$.allocs') AS a), 0)")
# the host that ran its command (its first; a job's outcome is its first unit's)
FIRST_HOST = "json_extract(jobs.hosts, '$[0][0]')"
DAY = "date({}, 'unixepoch', 'localtime')"  # a time's day, as usage_by_day counts them


def project_sql() -> str:
    """SQL for a live job's project (NULL: none). The one place that says where it is stored: the
    `project` column (migration 0010), set at submit for jobs and array elements alike."""
    return "jobs.project"


class UsageStore:
    def _reader(self) -> apsw.Connection:  # provided by JobStore
        raise NotImplementedError

    def usage_rows(self, since: float, until: float) -> list[tuple[float, float | None, float | None, int]]:
        """(submit, start, end, slots) of every job that waited or ran at some time in [since, until)."""
        return list(self._reader().execute(
            f"SELECT submit_time, start_time, end_time, {_SLOTS} FROM jobs "
            f"WHERE submit_time < ? AND (end_time IS NULL OR end_time > ?)", (until, since)))

    def usage_by_day(self, since: float) -> list[dict]:
        """Per (day, user, queue) of the finished jobs that ended since `since`: jobs, DONE, EXIT,
        slot-hours, cpu-hours; days as YYYY-MM-DD in the controller's local time, oldest first."""
        rows = self._reader().execute(
            f"SELECT date(end_time, 'unixepoch', 'localtime') AS day, user, queue, count(*), "
            f"sum(state = 'DONE'), sum(state = 'EXIT'), "
            f"sum(CASE WHEN start_time IS NULL THEN 0 ELSE (end_time - start_time) * {_SLOTS} END) / 3600.0, "
            f"coalesce(sum(cpu_time), 0) / 3600.0 "
            f"FROM jobs WHERE state IN (?, ?) AND end_time >= ? GROUP BY 1, 2, 3 "
            # archived jobs (store/archive.py) by their day sums: the days wholly after `since`
            f"UNION ALL SELECT day, substr(key, 1, instr(key, char(9)) - 1), substr(key, instr(key, char(9)) + 1), "
            f"jobs, done, exit, slot_s / 3600.0, cpu_s / 3600.0 FROM usage_daily "
            f"WHERE dim = 'user_queue' AND day > {DAY.format('?')}",
            (*_FINISHED, since, since))
        merged: dict[tuple[str, str, str], list] = {}
        for day, user, queue, n, done, exited, slot_hours, cpu_hours in rows:
            total = merged.setdefault((day, user, queue), [0, 0, 0, 0.0, 0.0])
            for i, value in enumerate((n, done, exited, slot_hours or 0.0, cpu_hours or 0.0)):
                total[i] += value
        return [{"day": day, "user": user, "queue": queue, "jobs": n, "done": done, "exit": exited,
                 "slot_hours": round(slot_hours, 4), "cpu_hours": round(cpu_hours, 4)}
                for (day, user, queue), (n, done, exited, slot_hours, cpu_hours) in sorted(merged.items())]

    def flows_of(self, user: str, limit: int = 200) -> list[dict]:
        """The user's flows, most recent first: id, name, submit time, the flow it rescued, steps."""
        rows = self._reader().execute(
            "SELECT f.id, f.name, f.submit_time, f.rescue_of, (SELECT count(*) FROM flow_steps s "
            "WHERE s.flow_id = f.id) FROM flows f WHERE f.user = ? ORDER BY f.id DESC LIMIT ?", (user, limit))
        return [{"id": i, "name": name, "submit_time": t, "rescue_of": rescue_of, "steps": n}
                for i, name, t, rescue_of, n in rows]


def series(rows: Iterable[tuple[float, float | None, float | None, int]], since: float, until: float,
           step: float) -> list[list[float]]:
    """[[t, busy slots, running jobs, waiting jobs], ...] for each step up to `until` (the steps end
    there, so the first one may start a little before `since`): busy slots is the average over the
    step (slot-seconds / step), the counts are sampled at its end, t. A row's running time is
    [start, end or until); its waiting time [submit, start or end or until)."""
    n = max(1, min(MAX_POINTS, math.ceil((until - since) / step)))
    since = until - n * step
    busy = [0.0] * (n + 1)
    full = [0.0] * (n + 1)  # difference array: slots busy for whole steps
    running = [0] * (n + 1)
    waiting = [0] * (n + 1)

    def index(t: float) -> int:
        return min(n, max(0, math.floor((t - since) / step)))

    def count(marks: list[int], a: float, b: float) -> None:
        """Samples t_k = since + (k + 1) * step with a <= t_k < b."""
        first = max(0, math.ceil((a - since) / step - 1))
        last = n if b == math.inf else min(n, max(0, math.ceil((b - since) / step - 1)))
        if first < last:
            marks[first] += 1
            marks[last] -= 1

    for submit, start, end, slots in rows:
        stop = end if end is not None else math.inf  # still running or waiting: at every sample from then on
        if start is not None and start < stop:
            a, b = max(start, since), min(stop, until)
            if a < b:
                i, j = index(a), index(b)
                if i == j:
                    busy[i] += (b - a) * slots
                else:
                    busy[i] += (since + (i + 1) * step - a) * slots
                    busy[j] += (b - (since + j * step)) * slots
                    full[i + 1] += slots
                    full[j] -= slots
            count(running, start, stop)
        count(waiting, submit, start if start is not None else stop)
    points, whole, run, wait = [], 0.0, 0, 0
    for k in range(n):
        whole += full[k]
        run += running[k]
        wait += waiting[k]
        points.append([since + (k + 1) * step, round((busy[k] + whole * step) / step, 3), run, wait])
    return points
