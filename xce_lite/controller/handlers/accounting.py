"""The controller's API routes for `xce hist` (GET /jobs/history: every event of jobs, live or
archived) and `xce acct` (GET /accounting/summary: finished jobs summed by user, project, queue or
host). Both only read the store; the CLI sends what the user typed and prints the reply.

Anyone may read anyone's history and usage, as `xce jobs -u all` and the dashboard's accounting
already show them (LSF's bhist -u all and bacct -u all do the same); but on a shared cluster with
`visibility: summary`, where the route table (controller/shared.py) hides others' command lines
and keeps usage to its user, the admins and the project admins (project:view). Times (--since, --until) are
parsed here, with the controller's clock and local time (accounting.parse_when).
Replies are versioned (`schema`): fields are added, never renamed.
"""

from __future__ import annotations

import re
import time
from typing import Any, overload

from xce_lite import accounting, errors
from xce_lite.api.caller import Caller
from xce_lite.controller.shared import Handler
from xce_lite.store.accounting import BY

HISTORY_LIMIT = 1000  # jobs in one reply; more: the newest, and `truncated`
_REF = re.compile(r"^\s*(\d+)(?:\[(\d+)\])?\s*$")


class AccountingRoutes:
    """The two routes, reading the store."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("GET", "/jobs/history"): self.api_history,
            ("GET", "/accounting/summary"): self.api_accounting_summary,
        }

    def api_history(self, caller: Caller, query: dict, body: Any) -> dict:
        """Jobs named in `ids` (42, an array's 42 takes its elements, 42[7]); else the jobs of `user`
        (default: the caller; `all`) in `project` whose life overlaps [since, until) (default: the
        last 7 days). Each with its events in order and its time by state."""
        now = time.time()
        ids, arrays, elements = _refs(query.get("ids", ""))
        named = bool(ids or arrays or elements)
        user = query.get("user") or (None if named else caller.user)
        user = None if user == "all" else user
        since = _when(query, "since", now, None if named else now - 7 * 86400)
        until = _when(query, "until", now, None)
        jobs, more = self.store.history(ids, arrays, elements, user=user, project=query.get("project") or None,
                                        since=since, until=until, limit=HISTORY_LIMIT)
        if named and not jobs:
            raise errors.NotFound(f"no job {query.get('ids')} in the store or its archive (see `xce jobs -a`)")
        for job in jobs:
            job["display_id"] = (f"{job['array_id']}[{job['array_index']}]" if job["array_id"] is not None
                                 else str(job["id"]))
            job["time_in_states"] = accounting.time_in_states(job["events"], now)
            job["events"] = [{"time": t, "kind": kind, "data": data} for t, kind, data in job["events"]]
        return {"schema": 1, "since": since, "until": until, "jobs": jobs, "truncated": more}

    def api_accounting_summary(self, caller: Caller, query: dict, body: Any) -> dict:
        """Finished jobs that ended in [since, until) (default: the last 30 days), summed per `by`
        (user, project, queue, host; default user), for `user` (default everyone) and `project`."""
        now = time.time()
        by = query.get("by") or "user"
        if by not in BY:
            raise errors.SpecError(f"--by {by!r}: choose one of {', '.join(BY)}")
        since = _when(query, "since", now, now - 30 * 86400)
        until = _when(query, "until", now, now)
        if until <= since:
            raise errors.SpecError("--until must be later than --since")
        user = query.get("user") or None
        user = None if user == "all" else user
        project = query.get("project") or None
        groups = accounting.summarise(*self.store.accounting_inputs(by, since, until, user, project))
        total = accounting.Tally()
        for tally in groups.values():
            total.merge(tally)
        return {"schema": 1, "by": by, "since": since, "until": until, "user": user, "project": project,
                "rows": [{"key": key, **tally.report()} for key, tally in sorted(groups.items())],
                "total": total.report()}


@overload
def _when(query: dict, name: str, now: float, default: float) -> float: ...
@overload
def _when(query: dict, name: str, now: float, default: None) -> float | None: ...
def _when(query: dict, name: str, now: float, default: float | None) -> float | None:
    text = query.get(name)
    if text is None or text == "":
        return default
    return accounting.parse_when(text, now, f"--{name}")


def _refs(text: str) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """`42,43[7]` -> job ids (42 is also looked up as an array), arrays, (array, index) elements."""
    ids, arrays, elements = [], [], []
    for part in (p for p in text.split(",") if p.strip()):
        match = _REF.match(part)
        if match is None:
            raise errors.SpecError(f"{part!r} is not a job id: give 42, or 42[7] for an array's element")
        if match.group(2) is None:
            ids.append(int(match.group(1)))
            arrays.append(int(match.group(1)))
        else:
            elements.append((int(match.group(1)), int(match.group(2))))
    return ids, arrays, elements
