"""The controller's API route that takes jobs: `POST /jobs` (`xce submit`), and the checks every
spec passes before it is stored (used by flows too, handlers/flow.py).

A part of the controller (`Controller.submitting`), given the shared state, the store, the clock,
the counters and the parts a submit asks: gating (-w, arrays), projects, pool views and the
access rules. All or nothing: every spec of a request is validated (and its dependency resolved)
before any is stored; the jobs are on disk before the reply, then admitted under the lock.
"""

from __future__ import annotations

import os
import re
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.config.merge import Effective
from xce_lite.config.sched_view import admit
from xce_lite.controller import accept, submit_wake
from xce_lite.controller.gating import Gating
from xce_lite.controller.metrics import Registry
from xce_lite.controller.pool_views import PoolViews
from xce_lite.controller.projects import ProjectShares
from xce_lite.controller.seams import Clock
from xce_lite.controller.shared import Access, Handler
from xce_lite.controller.state import ControllerState
from xce_lite.models import JobSpec
from xce_lite.sched.placement import HostView, JobRequest, why_never


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{8,128}")  # what request_id_of takes (ASCII only)
ADMITS_KEPT = 4096  # distinct raw specs whose admit is remembered


class Submitting:
    """See the module docstring."""

    def __init__(self, state: ControllerState, store: Any, clock: Clock, metrics: Registry, gating: Gating,
                 projects: ProjectShares, pool_views: PoolViews, access: Access) -> None:
        self.state, self.store, self.clock, self.metrics = state, store, clock, metrics
        self.gating, self.projects, self.pool_views, self.access = gating, projects, pool_views, access
        # why_never's answers by request shape, for the host totals they were computed on
        self._never_memo: tuple[tuple[HostView, ...], dict[tuple, str | None]] | None = None
        # admit's answers by the raw spec's repr, for the (config, profiles, totals) they were made under
        self._admit_memo: tuple[tuple, dict[str, tuple[JobSpec, str, Effective]]] | None = None
        # accept.admit's merges of plain jobs, for the (config, profiles) they were made under; read
        # and changed under the state's lock
        self._templates: tuple[tuple, accept.Templates] | None = None

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {("POST", "/jobs"): self.api_submit}

    def api_submit(self, caller: Caller, query: dict, body: Any) -> dict:
        """Validate every spec (all or nothing), resolve its dependency, store them (an array as its
        elements), wake the scheduler (unless no slot is free: submit_wake.py), return the ids (an
        array's is its first element's).

        With a `request_id` (the client's, for one submission), a repeat of that id after a lost
        reply is answered with the jobs the first one stored, and stores nothing."""
        if not isinstance(body, dict) or not isinstance(body.get("jobs"), list) or not body["jobs"]:
            raise errors.SpecError('send {"jobs": [spec, ...]} with at least one job spec')
        request_id = request_id_of(body)
        try:
            accepted = accept.specs(body["jobs"], caller, self.validate,  # checked and merged once per distinct spec
                                    self.gating.resolve_depend)
        except errors.XceError:
            # A repeat is answered with what the first one stored even if its specs no longer pass
            # (its cwd removed, its queue reconfigured away). Looked up here, on refusal only: a
            # repeat that passes is found by submit_once in its write transaction, so a new
            # request costs no read of its own (one-POST-per-job submits are mostly new ones).
            stored = self.store.submitted(request_id, caller.user) if request_id is not None else None
            if stored is not None:
                return self._submitted_reply(stored)
            raise
        now = self.clock.time()  # the seam: a simulation submits at its own time
        if request_id is None:
            ids = self.store.submit(accepted, caller.user, now)  # on disk before the reply
        else:
            ids, new = self.store.submit_once(accepted, caller.user, now, request_id)
            if not new:  # the same request, sent again meanwhile: it stored them
                return self._submitted_reply(ids)
        self.metrics.inc("submits", sum(len(item.indices) or 1 for item in accepted))  # metrics:
        with self.state.mu:
            accept.admit(self.gating, self.state.pending, ids, accepted, caller.user, now,  # pending in one step
                         self._templates_now())
            self.state.dirty = True
            jobs = sum(len(item.indices) or 1 for item in accepted)
            wake = submit_wake.wakes(self.state, now, jobs)  # not while no slot is free: the session waits a little
        if wake:
            self.state.wake.set()
        return {"ids": ids, "queues": [item.queue for item in accepted],
                "sizes": [len(item.indices) or None for item in accepted]}

    def _templates_now(self) -> accept.Templates:
        """accept.admit's merges kept across requests, afresh under a new configuration or profile
        set (what a pending job's merge reads) and bounded like the admits. Holds the state's lock."""
        setup = (self.state.config, self.state.profiles)
        kept = self._templates
        if kept is None or kept[0][0] is not setup[0] or kept[0][1] is not setup[1] or len(kept[1]) > ADMITS_KEPT:
            kept = self._templates = (setup, {})
        return kept[1]

    def _submitted_reply(self, ids: list[int]) -> dict:
        """The reply a submission got, rebuilt from the store (for a repeated request id)."""
        queues = {job.id: job.queue for job in self.store.jobs(ids)}
        sizes = [self.store.array_size(i) for i in ids]  # an array's id is its first element's
        return {"ids": ids, "queues": [queues.get(i, "") for i in ids], "sizes": sizes, "repeated": True}

    def validate(self, raw: Any, caller: Caller | None = None) -> tuple[JobSpec, str]:
        """The spec as it will be stored (its profile name and project resolved), and its queue's
        name; SpecError if its effective values break a rule or could never run (merge.py), or its
        project refuses it (projects.py)."""
        spec, queue_name, eff = self._admitted(raw)
        spec = self.projects.project_of(spec, eff, caller)
        self.pool_views.admit(queue_name, eff)  # pools.py: a -W no allocation of the queue's pools can hold
        if not os.path.isdir(spec.cwd):
            raise errors.SpecError(f"working directory {spec.cwd} does not exist or is not a directory")
        if not os.access(spec.cwd, os.R_OK | os.X_OK):
            raise errors.SpecError(f"working directory {spec.cwd} is not readable by the controller")
        checked = spec.cwd  # a directory found just now is not looked up again (-o and -e mostly go there)
        for option, path in (("-o", spec.stdout), ("-e", spec.stderr)):
            if path is None:
                continue
            directory = os.path.dirname(path) or "/"
            if directory != checked:
                if not os.path.isdir(directory):
                    raise errors.SpecError(f"{option} {path}: its directory does not exist; create it first")
                checked = directory
        return self.access.as_submitter(spec, queue_name, caller), queue_name  # shared.py: queue ACL, run as whom

    def _admitted(self, raw: Any) -> tuple[JobSpec, str, Effective]:
        """`admit` of the raw spec: what depends on the spec and the configuration alone (its parse,
        merge and "could never run"), remembered by the spec's repr (accept._key: equal only for
        equal values of the same types) while the configuration, profiles and host totals are the
        same objects (a reconfig or a pool view replaces them). What reads the caller or the file
        system (projects, paths, queue ACL) is checked at every submit."""
        state = self.state
        setup = (state.config, state.profiles, state.host_totals)
        memo = self._admit_memo
        if memo is None or any(a is not b for a, b in zip(memo[0], setup)) or len(memo[1]) > ADMITS_KEPT:
            memo = self._admit_memo = (setup, {})
        key = repr(raw) if type(raw) is dict else None
        found = memo[1].get(key) if key is not None else None
        if found is None:
            found = admit(JobSpec.from_wire(raw), state.config, state.profiles, state.host_totals, self._why_never)
            if key is not None:
                memo[1][key] = found
        return found

    def _why_never(self, request: JobRequest) -> str | None:
        """`why_never` on the cluster's totals, memoised by request shape while those totals are the
        same object (a new config or pool view replaces them): 1,000 hosts cost ~25 ms a submit."""
        totals = self.state.host_totals
        memo = self._never_memo
        if memo is None or memo[0] is not totals:
            memo = self._never_memo = (totals, {})
        key = (request.min_tasks, request.max_tasks, request.resreq)
        if key not in memo[1]:
            memo[1][key] = why_never(request, totals, self.state.config.shared)
        return memo[1][key]


def request_id_of(body: dict) -> str | None:
    """The submission's request id: None, or 8 to 128 letters, digits and . _ : -."""
    value = body.get("request_id")
    if value is None:
        return None
    if not isinstance(value, str) or _REQUEST_ID.fullmatch(value) is None:
        raise errors.SpecError("request_id must be 8 to 128 letters, digits and . _ : - (a random one per submission)")
    return value
