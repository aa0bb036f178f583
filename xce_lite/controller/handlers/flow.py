"""The controller's API handlers for workflows: flows (submit, status, rescue). (`xce requeue`, and
acting on a whole array at once, are handlers/jobs.py's.)

A flow is submitted as one request whose steps come in
dependency order; every step is validated and every condition resolved before anything is stored,
then all its jobs go into the store in ONE transaction (all or nothing), with the flow's record.
In a step's condition a name is a step of the same flow: it resolves to a placeholder target
(-1 for the first step, ...) until the transaction has given the steps their ids.

A rescue (`xce flow rescue NAME`) looks at the user's most recent flow of that name once none of
its jobs is unfinished: steps that ended DONE (every element, for an array) are kept, and their
dependants see them as DONE; the others are submitted again, an array step with only its elements
that did not end DONE. The rescue is a flow of the same name, so `xce flow status NAME` shows it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.controller.gating import Gating
from xce_lite.controller.handlers.submit import Submitting, request_id_of
from xce_lite.controller.metrics import Registry
from xce_lite.controller.seams import Clock
from xce_lite.controller.shared import Handler
from xce_lite.controller.state import ControllerState
from xce_lite.models import DONE, FINISHED_STATES, JobSpec
from xce_lite.store.workflows import FlowRecord, FlowStep, NewJob
from xce_lite.workflow import arrays, deps
from xce_lite.workflow.flow import MAX_STEPS


class FlowRoutes:
    """See the module docstring. A part of the controller (`Controller.flows`), given the shared
    state, the store, the clock, the counters, gating and the submit checks (handlers/submit.py)."""

    def __init__(self, state: ControllerState, store: Any, clock: Clock, metrics: Registry, gating: Gating,
                 submitting: Submitting) -> None:
        self.state, self.store, self.clock, self.metrics = state, store, clock, metrics
        self.gating, self.submitting = gating, submitting

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("POST", "/flows"): self.api_flow_submit,
            ("GET", "/flows"): self.api_flow_status,
            ("POST", "/flows/rescue"): self.api_flow_rescue,
        }

    # ---- flows -------------------------------------------------------------------------------------

    def api_flow_submit(self, caller: Caller, query: dict, body: Any) -> dict:
        """{"name": N, "steps": [{"step": S, "spec": {...}}, ...]}: steps in dependency order, each
        spec's `depend` on step names; all stored at once, or nothing. With a `request_id`, as for
        `xce submit`: a repeat after a lost reply gets the first reply and stores nothing."""
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not isinstance(
                body.get("steps"), list) or not body["steps"]:
            raise errors.SpecError('send {"name": FLOW, "steps": [{"step": NAME, "spec": {...}}, ...]}')
        request_id = request_id_of(body)
        if request_id is not None and (first := self.store.flow_submitted(request_id, caller.user)) is not None:
            return {**first, "repeated": True}
        if len(body["steps"]) > MAX_STEPS:
            raise errors.SpecError(f"a flow has at most {MAX_STEPS} steps")
        steps = []
        for raw in body["steps"]:
            if not isinstance(raw, dict) or not isinstance(raw.get("step"), str):
                raise errors.SpecError('each step is {"step": NAME, "spec": {...}}')
            try:
                steps.append((raw["step"], *self.submitting.validate(raw.get("spec"), caller)))
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

        now = self.clock.time()
        if request_id is None:
            ids = self.store.submit(items, user, now, depends=depends, flow=flow)
        else:
            answer, new = self.store.submit_flow_once(items, user, now, request_id, depends, flow, reply)
            if not new:  # the same request, sent again meanwhile: it stored them
                return {**answer, "repeated": True}
            ids = [s["id"] for s in answer["steps"]]
        self.metrics.inc("submits", sum(len(item.indices) or 1 for item in items))  # metrics:
        with self.state.mu:
            for job_id, item in zip(ids, items):
                self.gating.admit(job_id, replace(item, depend=_placed(item.depend, ids)), user, now)
            self.state.dirty = True
        self.state.wake.set()
        return reply(ids)

    def api_flow_status(self, caller: Caller, query: dict, body: Any) -> dict:
        view = self._flow_view(caller, query.get("name"))
        states = self._step_states(view)
        with self.state.mu:
            reasons = dict(self.state.reasons)
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
        request_id = request_id_of(body) if isinstance(body, dict) else None
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
