"""The controller's API handlers for workflows: flows (submit, status, rescue), `xce requeue`, and
acting on a whole array at once.

A mixin of `Controller`, like handlers.py. A flow is submitted as one request whose steps come in
dependency order; every step is validated and every condition resolved before anything is stored,
then all its jobs go into the store in ONE transaction (all or nothing), with the flow's record.
In a step's condition a name is a step of the same flow: it resolves to a placeholder target
(-1 for the first step, ...) until the transaction has given the steps their ids.

A rescue (`xce flow rescue NAME`) looks at the user's most recent flow of that name once none of
its jobs is unfinished: steps that ended DONE (every element, for an array) are kept, and their
dependants see them as DONE; the others are submitted again, an array step with only its elements
that did not end DONE. The rescue is a flow of the same name, so `xce flow status NAME` shows it.

`xce requeue` takes a dispatched or running job back to PEND (or PSUSP with --hold) on the same
path as a job whose host was lost: its units are asked to stop and drain, the job keeps its id and
submit time, and its next dispatch is a new attempt.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

from xce_lite import errors
from xce_lite.api.server import Caller
from xce_lite.controller.handlers.jobs import _refs_of, _request_id
from xce_lite.models import ACTIVE_STATES, DONE, EXIT, FINISHED_STATES, PEND, PSUSP, Job, JobSpec
from xce_lite.store.jobs import Requeue
from xce_lite.store.workflows import FlowRecord, FlowStep, NewJob
from xce_lite.workflow import arrays, deps
from xce_lite.workflow.flow import MAX_STEPS


class FlowHandlers:
    def flow_routes(self) -> dict:
        return {
            ("POST", "/flows"): self.api_flow_submit,
            ("GET", "/flows"): self.api_flow_status,
            ("POST", "/flows/rescue"): self.api_flow_rescue,
            ("POST", "/jobs/requeue"): self.api_requeue,
        }

    # ---- acting on jobs, arrays and elements --------------------------------------------------------

    def _owned_refs(self, caller: Caller, body: Any) -> list[tuple[str, list[Job], bool]]:
        """(as named, its jobs, is a whole array) for each job, array or element the request names."""
        refs = self.gating.expand_refs(_refs_of(body))
        owned = {j.id: j for j in self._owned(caller, list(dict.fromkeys(i for _l, ids, _w in refs for i in ids)))}
        return [(label, [owned[i] for i in ids], whole) for label, ids, whole in refs]

    def _kill_pending(self, jobs: list[Job], caller: Caller, now: float) -> set[int]:
        """End pending jobs at once, one transaction per state; the ids that moved."""
        moved: set[int] = set()
        for state in (PEND, PSUSP):
            ids = [j.id for j in jobs if j.state == state]
            if not ids:
                continue
            with self._mu:
                done = self.store.change_state(ids, state, EXIT, "killed_pending", now,
                                               reason=f"killed by {caller.user} while pending", end_time=now)
                self.metrics.inc("finished", len(done), state="EXIT")  # metrics:
                for job_id in done:
                    self.gating.dequeue(job_id)
                    self._held.pop(job_id, None)
                    self.gating.ended_element(job_id)
                self._dirty = True
                self._finished.notify_all()
            moved.update(done)
        return moved

    def _move_pending(self, movable: list[tuple[Job, str]], event: str, reason: str | None) -> set[int]:
        """Hold or release: PEND <-> PSUSP, one transaction per (state, target)."""
        moved: set[int] = set()
        groups: dict[tuple[str, str], list[Job]] = defaultdict(list)
        for job, target in movable:
            groups[(job.state, target)].append(job)
        for (state, target), jobs in groups.items():
            with self._mu:  # the tick may not dispatch them between our check and the change
                done = set(self.store.change_state([j.id for j in jobs], state, target, event, time.time(),
                                                   reason=reason))
                for job in jobs:
                    if job.id not in done:
                        continue
                    if target == PSUSP:
                        self.gating.dequeue(job.id)
                        self._held[job.id] = job.user
                    else:
                        self._held.pop(job.id, None)
                        self.gating.enqueue(job.id, job.user, job.queue, job.spec, job.submit_time, job.array_id,
                                      job.depend)
                self._dirty = True
            moved |= done
        return moved

    def api_requeue(self, caller: Caller, query: dict, body: Any) -> dict:
        """Dispatched or running jobs back to PEND (`hold`: PSUSP), by the lost-host path."""
        hold = bool(body.get("hold")) if isinstance(body, dict) else False
        results = []
        for _label, jobs, _whole in self._owned_refs(caller, body):
            for job in jobs:
                name = job.display_id
                with self._mu:
                    active = self._active.get(job.id)
                    if active is None or active.ending or job.state not in ACTIVE_STATES:
                        ok, message = False, (f"Job <{name}> is {job.state}: only a dispatched or running job is "
                                              f"requeued" + ("; submit it again" if job.state in FINISHED_STATES
                                                             else ""))
                    elif active.killed:  # kill wins (kills.py): the store would refuse it too
                        ok, message = False, f"Job <{name}> is being killed ({active.killed}); it is not requeued"
                    else:
                        active.ending = True
                        self._unrecorded_requeues.append(
                            Requeue(job.id, active.state, f"requeued by {caller.user}", hold=hold))
                        ok, message = True, f"Job <{name}> is being requeued" + (" and held" if hold else "")
                results.append({"id": name, "ok": ok, "message": message})
        self._wake.set()
        return {"results": results}

    # ---- flows -------------------------------------------------------------------------------------

    def api_flow_submit(self, caller: Caller, query: dict, body: Any) -> dict:
        """{"name": N, "steps": [{"step": S, "spec": {...}}, ...]}: steps in dependency order, each
        spec's `depend` on step names; all stored at once, or nothing. With a `request_id`, as for
        `xce submit`: a repeat after a lost reply gets the first reply and stores nothing."""
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not isinstance(
                body.get("steps"), list) or not body["steps"]:
            raise errors.SpecError('send {"name": FLOW, "steps": [{"step": NAME, "spec": {...}}, ...]}')
        request_id = _request_id(body)
        if request_id is not None and (first := self.store.flow_submitted(request_id, caller.user)) is not None:
            return {**first, "repeated": True}
        if len(body["steps"]) > MAX_STEPS:
            raise errors.SpecError(f"a flow has at most {MAX_STEPS} steps")
        steps = []
        for raw in body["steps"]:
            if not isinstance(raw, dict) or not isinstance(raw.get("step"), str):
                raise errors.SpecError('each step is {"step": NAME, "spec": {...}}')
            try:
                steps.append((raw["step"], *self._validate(raw.get("spec"), caller)))
            except errors.SpecError as err:
                raise errors.SpecError(f"step {raw['step']}: {err}") from None
        if len({s for s, _spec, _q in steps}) < len(steps):
            raise errors.SpecError("two steps have the same name")
        return self._submit_flow(caller.user, body["name"], steps, request_id=request_id)

    def _submit_flow(self, user: str, name: str, steps: list[tuple[str, JobSpec, str]], rescue_of=None,
                     request_id: str | None = None) -> dict:
        """Resolve every step's condition (names: earlier steps, or a rescued flow's kept ones), store
        it all in one transaction, admit the jobs. `rescue_of`: the FlowView rescued, and the steps
        of it kept ({step: target}); `request_id`: remembered with the reply in that transaction."""
        view, kept = rescue_of if rescue_of is not None else (None, {})
        known: dict[str, deps.Target] = dict(kept)
        items, records = [], []
        for position, (step, spec, queue) in enumerate(steps):
            try:
                depend = self.gating.resolve_depend(spec, user, known)
            except errors.SpecError as err:
                raise errors.SpecError(f"step {step}: {err}") from None
            indices = arrays.parse(spec.array).indices if spec.array else ()
            items.append(NewJob(spec, queue, indices, depend))
            upstream = sorted({t.label for t in deps.targets(deps.from_json(depend)) if t.label in known}) \
                if depend else []
            records.append(FlowStep(step, bool(indices), spec.depend, tuple(upstream)))
            known[step] = deps.Target(-(position + 1), bool(indices), step)  # its id once stored

        def depends(ids: list[int]) -> list[dict | None]:
            return [_placed(item.depend, ids) for item in items]

        if view is not None:  # the whole graph, in its order: the kept steps as they were, the others anew
            fresh = {r.step: r for r in records}
            ordered = tuple(fresh.get(s.step, s) for s, _job_id in view.steps)
        else:
            ordered = tuple(records)
        flow = FlowRecord(name, ordered, view.id if view is not None else None,
                          tuple((s, t.id) for s, t in kept.items()))
        def reply(ids: list[int]) -> dict:
            return {"flow": name, "steps": [{"step": s.step, "id": i, "array": s.is_array}
                                            for s, i in zip(records, ids)], "kept": sorted(kept)}

        now = time.time()
        if request_id is None:
            ids = self.store.submit(items, user, now, depends=depends, flow=flow)
        else:
            answer, new = self.store.submit_flow_once(items, user, now, request_id, depends, flow, reply)
            if not new:  # the same request, sent again meanwhile: it stored them
                return {**answer, "repeated": True}
            ids = [s["id"] for s in answer["steps"]]
        self.metrics.inc("submits", sum(len(item.indices) or 1 for item in items))  # metrics:
        with self._mu:
            for job_id, item in zip(ids, items):
                self.gating.admit(job_id, replace(item, depend=_placed(item.depend, ids)), user, now)
            self._dirty = True
        self._wake.set()
        return reply(ids)

    def api_flow_status(self, caller: Caller, query: dict, body: Any) -> dict:
        view = self._flow_view(caller, query.get("name"))
        states = self._step_states(view)
        with self._mu:
            reasons = dict(self._reasons)
        steps = []
        for step, job_id in view.steps:
            counts = dict(states[job_id])
            indices = counts.pop("indices", None)
            steps.append({"step": step.step, "id": job_id, "array": step.is_array, "state": _state_of(counts),
                          "indices": indices,
                          "states": counts, "depend": step.depend, "upstream": list(step.upstream),
                          "pend_reason": reasons.get(job_id) if not step.is_array else None})
        return {"schema": 1, "flow": {"id": view.id, "name": view.name, "user": view.user,
                                      "submit_time": view.submit_time, "rescue_of": view.rescue_of, "steps": steps}}

    def api_flow_rescue(self, caller: Caller, query: dict, body: Any) -> dict:
        request_id = _request_id(body) if isinstance(body, dict) else None
        if request_id is not None and (first := self.store.flow_submitted(request_id, caller.user)) is not None:
            return {**first, "repeated": True}  # before the checks: the first try made the flow busy again
        view = self._flow_view(caller, body.get("name") if isinstance(body, dict) else None)
        states = self._step_states(view)
        busy = [s.step for s, job_id in view.steps
                if any(state not in FINISHED_STATES for state in states[job_id] if state != "indices")]
        if busy:
            raise errors.TransitionError(f"flow {view.name} still has unfinished steps ({', '.join(busy)}); wait for "
                                         f"them (`xce flow status {view.name}`) or kill them, then rescue")
        kept, again = {}, []
        for step, job_id in view.steps:
            if set(states[job_id]) - {"indices"} == {DONE}:
                kept[step.step] = deps.Target(job_id, step.is_array, step.step)
                continue
            spec, queue = self._rescued_spec(step, job_id)
            again.append((step.step, spec, queue))
        if not again:
            raise errors.TransitionError(f"flow {view.name}: every step ended DONE; there is nothing to rescue")
        return self._submit_flow(caller.user, view.name, again, (view, kept), request_id)

    def _rescued_spec(self, step: FlowStep, job_id: int) -> tuple[JobSpec, str]:
        """The step's spec to submit again: an array with only its elements that did not end DONE."""
        if not step.is_array:
            job = self.store.get(job_id)
            return replace(job.spec, hold=False), job.queue
        elements = self.store.jobs(self.store.element_ids(job_id))
        left = tuple(j.array_index for j in elements if j.state != DONE)
        throttle = arrays.throttle_of(elements[0].spec.array or "")
        return replace(elements[0].spec, hold=False, array=arrays.ArraySpec(left, throttle).text()), elements[0].queue

    def _flow_view(self, caller: Caller, name: Any):
        if not isinstance(name, str) or not name:
            raise errors.SpecError("name a flow: `xce flow status NAME`")
        view = self.store.flow(caller.user, name)
        if view is None:
            known = self.store.flow_names(caller.user)
            raise errors.NotFound(f"you have no flow named {name!r}" + (f"; yours: {', '.join(known)}" if known
                                                                         else "; submit one with `xce flow submit`"))
        return view

    def _step_states(self, view) -> dict[int, dict[str, int]]:
        """Each step's job id -> its count by state (one job: that job's state, once); an array's
        also holds its `indices` ("[1-20]")."""
        singles = [job_id for step, job_id in view.steps if not step.is_array]
        states = {j.id: {j.state: 1} for j in self.store.jobs(singles)} if singles else {}
        arrays_ids = [job_id for step, job_id in view.steps if step.is_array]
        for summary in self.store.array_summaries(arrays_ids) if arrays_ids else []:
            states[summary["id"]] = {**summary["states"], "indices": summary["indices"].split("%")[0]}
        return states


def _state_of(counts: dict[str, int]) -> str:
    """One state for a step: its job's, or for an array the most telling of its elements'."""
    for state in ("RUN", "DISP", "USUSP", "SSUSP", "PEND", "PSUSP", "EXIT"):
        if counts.get(state):
            return state
    return DONE


def _placed(depend: dict | None, ids: list[int]) -> dict | None:
    """A resolved condition with each placeholder target (-k: the k-th step submitted) given its id."""
    if depend is None:
        return None
    if "c" in depend:
        return {**depend, "id": ids[-depend["id"] - 1]} if depend["id"] < 0 else depend
    if "not" in depend:
        return {"not": _placed(depend["not"], ids)}
    key = "and" if "and" in depend else "or"
    return {key: [_placed(item, ids) for item in depend[key]]}
