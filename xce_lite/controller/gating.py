"""The controller's pending path for workflows: which pending jobs the scheduler sees (the gate:
dependencies and array throttles, gate.py), resolving `-w` when a job is submitted, and naming
jobs and array elements in requests (`42`, `42[7]`).

A part of the controller (`Controller.gating`), given the shared state, the store and how a pending
job is seen by the scheduler (`pending_job`). Every job that becomes PEND
(submitted, released, requeued, loaded at start) goes through `enqueue`: straight into the
scheduler's pending set, or, with a dependency or a throttled array, into the gate, which feeds it
when it may start. The gate step of the tick reads the facts its dependencies need from the store
(what the store committed: a job that ended in the tick before counts at once, since every commit
that changes a state marks the gate to be looked at again and wakes the next tick), and a
dependency that can never hold cancels its job in the tick's commit.

Name resolution (`-w done(prep)`, README "Dependencies"): a name is the submitting user's most
recent job or array of that name, resolved once, when the dependant is submitted (a later job of
the same name does not change it); `*` matches any text, and each matching name (its most recent
job) must meet the condition. An id may name any user's job: a dependency only reads the state of
the job it names, as `xce jobs -u all` shows it to everyone; a name never resolves to another
user's job.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from xce_lite import errors
from xce_lite.controller.state import ControllerState
from xce_lite.models import PEND, JobSpec
from xce_lite.sched.core import PendingJob
from xce_lite.workflow import arrays, deps, deps_eval
from xce_lite.workflow.gate import Gate, Waiter

_REF = re.compile(r"\s*(\d+)(?:\[(\d+)\])?\s*")


class Gating:
    """See the module docstring. `pending_job(id, user, queue, spec, submit_time)`: the scheduler's
    view of a pending job (the Controller's, with the pools' time-left term)."""

    def __init__(self, state: ControllerState, store: Any,
                 pending_job: Callable[[int, str, str, JobSpec, float], PendingJob]) -> None:
        self.state, self.store, self.pending_job = state, store, pending_job
        self.gate = Gate()
        self.array_of: dict[int, int] = {}  # unfinished element -> its array
        self.array_left: Counter[int] = Counter()  # array -> its elements in array_of
        self.exprs: dict[int, deps.Expr] = {}  # array id -> the dependency its elements share
        self.templates: dict[tuple[int, str], tuple[JobSpec, PendingJob]] = {}  # (array, queue) -> merged once

    # ---- the pending path ---------------------------------------------------------------------------

    def enqueue(self, job_id: int, user: str, queue: str, spec: JobSpec, submit_time: float,
                 array_id: int | None = None, depend: dict | None = None) -> None:
        """A job is PEND now: to the scheduler's pending set, or to the gate. Holds _mu."""
        throttle = None
        if array_id is not None:
            self.note_element(job_id, array_id)
            throttle = arrays.throttle_of(spec.array) if spec.array else None
        if depend is None and throttle is None:
            self.state.pending.add(self.pending_of(job_id, user, queue, spec, submit_time, array_id))
            return
        expr = None
        if depend is not None:
            expr = self.exprs.get(array_id) if array_id is not None else None
            if expr is None:
                expr = deps.from_json(depend)
                if array_id is not None:
                    self.exprs[array_id] = expr
        self.gate.add(Waiter(job_id, expr, spec.on_dep_fail, array_id, throttle,
                              (user, queue, spec, submit_time)))
        self.state.gate_dirty = True

    def admit(self, job_id: int, item: Any, user: str, now: float) -> None:
        """A job (or an array: its elements) just stored: held, or on the pending path. Holds _mu."""
        spec, queue = item.spec, item.queue
        ids = range(job_id, job_id + len(item.indices)) if item.indices else (job_id,)
        array_id = job_id if item.indices else None
        for element in ids:
            if spec.hold:
                self.state.held[element] = user
                if array_id is not None:
                    self.note_element(element, array_id)
            else:
                self.enqueue(element, user, queue, spec, now, array_id, item.depend)

    def dequeue(self, job_id: int) -> None:
        """A pending job is no longer PEND (held, killed, dispatched, cancelled). Holds _mu."""
        self.state.pending.discard(job_id)
        self.gate.remove(job_id)
        self.state.reasons.pop(job_id, None)
        self.state.stored_reasons.pop(job_id, None)
        self.state.gate_dirty = True

    def pending_of(self, job_id: int, user: str, queue: str, spec: JobSpec, submit_time: float,
                    array_id: int | None) -> PendingJob:
        """`pending_job`, merged once per array (its elements share one spec object)."""
        if array_id is None:
            return self.pending_job(job_id, user, queue, spec, submit_time)
        cached = self.templates.get((array_id, queue))
        if cached is None or cached[0] is not spec:
            cached = (spec, self.pending_job(job_id, user, queue, spec, submit_time))
            self.templates[(array_id, queue)] = cached
        template = cached[1]
        return replace(template, id=job_id, submit_time=submit_time, request=replace(template.request, id=job_id))

    def note_element(self, job_id: int, array_id: int) -> None:
        if job_id not in self.array_of:
            self.array_of[job_id] = array_id
            self.array_left[array_id] += 1

    def ended_element(self, job_id: int) -> None:
        """An element finished: forget it (and its array's merge when none is left). Holds _mu."""
        array_id = self.array_of.pop(job_id, None)
        if array_id is None:
            return
        self.array_left[array_id] -= 1
        if self.array_left[array_id] <= 0:
            del self.array_left[array_id]
            self.exprs.pop(array_id, None)
            for key in [k for k in self.templates if k[0] == array_id]:
                del self.templates[key]

    # ---- 3. gate (a tick step) --------------------------------------------------------------------

    def step(self) -> list[tuple[int, str, str]]:
        """Decide the gate's jobs against what the store says now: feed the scheduler those that may
        start, take back those whose dependency stopped holding, and return the cancels
        (job id, PEND, why) for the tick's commit."""
        with self.state.mu:
            if not self.state.gate_dirty or not len(self.gate):
                return []
            self.state.gate_dirty = False
            targets = self.gate.targets()
        rows = self.store.group_rows([t.id for t in targets if not t.array],
                                     [t.id for t in targets if t.array]) if targets else {}
        facts = {key: deps_eval.group_facts(value) for key, value in rows.items()}
        with self.state.mu:
            active = Counter(self.array_of[j] for j in self.state.active if j in self.array_of)
            decision = self.gate.decide(lambda t: facts.get((t.id, t.array)), active)
            for job_id in decision.feed:
                user, queue, spec, submit_time = self.gate.waiters[job_id].payload
                self.state.pending.add(self.pending_of(job_id, user, queue, spec, submit_time,
                                                   self.array_of.get(job_id)))
            for job_id in decision.unfeed:
                self.state.pending.discard(job_id)
            self.state.reasons.update(decision.reasons)
            if decision.feed or decision.unfeed:
                self.state.dirty = True
        return [(job_id, PEND, reason) for job_id, reason in decision.cancel]

    # ---- resolving -w at submit ------------------------------------------------------------------------

    def resolve_depend(self, spec: JobSpec, user: str, steps: dict[str, deps.Target] | None = None) -> dict | None:
        """The job's dependency with every job it names resolved (module docstring); SpecError
        naming the job that does not exist. `steps`: in a flow, names are its steps."""
        if spec.depend is None:
            return None
        expr = deps.parse(spec.depend)

        def lookup(ref: deps.Ref) -> list[deps.Target]:
            if ref.id is not None:
                return [self._target_of_id(ref, ref.id)]
            if steps is not None:
                return _steps_matching(ref, steps, spec.depend or "")
            return self._targets_named(ref, user, spec.depend or "")

        return deps.to_json(deps.resolve(expr, lookup))

    def _target_of_id(self, ref: deps.Ref, job_id: int) -> deps.Target:
        """`ref`, which names job `job_id` (ref.id), as a target."""
        owner = self.store.owner(job_id)
        if owner is None:
            raise errors.SpecError(f"-w: there is no job {ref.id} (see `xce jobs -a`)")
        _user, array_id, _index = owner
        if ref.index is not None:
            if array_id != ref.id:
                raise errors.SpecError(f"-w: {ref.text()}: job {ref.id} is not an array")
            element = self.store.element(ref.id, ref.index)
            if element is None:
                raise errors.SpecError(f"-w: array {ref.id} has no element {ref.index}")
            return deps.Target(element, False, ref.text())
        return deps.Target(job_id, array_id == job_id, ref.text())

    def _targets_named(self, ref: deps.Ref, user: str, text: str) -> list[deps.Target]:
        name = ref.name or ""
        if "*" in name:
            found = [(n, job_id, array_id) for n, job_id, array_id in self.store.named_like(user, name)]
        else:
            latest = self.store.latest_named(user, name)
            found = [(name, *latest)] if latest else []
        if not found:
            raise errors.SpecError(f"-w at position {ref.pos + 1}: you have no job named {name!r} (a name is your "
                                   f"most recent job of that name; see `xce jobs -a`)")
        targets = []
        for found_name, job_id, array_id in found:
            label = found_name if ref.index is None else f"{found_name}[{ref.index}]"
            if ref.index is not None:
                element = self.store.element(array_id, ref.index) if array_id is not None else None
                if element is None:
                    raise errors.SpecError(f"-w: {label}: your job {found_name!r} is not an array with element "
                                           f"{ref.index}")
                targets.append(deps.Target(element, False, label))
            else:
                targets.append(deps.Target(array_id, True, label) if array_id is not None
                               else deps.Target(job_id, False, label))
        return targets

    # ---- naming jobs in requests -------------------------------------------------------------------

    def expand_refs(self, values: list) -> list[tuple[str, list[int], bool]]:
        """`42` (a job, or a whole array), `42[7]` (an element) -> (as named, job ids, is a whole array);
        NotFound for one that names nothing; the first value that is wrong is the one said."""
        parsed: list[tuple[int, str | None] | errors.XceError] = []
        for value in values:
            try:
                parsed.append(_parse_ref(value))
            except errors.XceError as err:
                parsed.append(err)  # said in its turn: an earlier value may name no job
                break
        owners = self.store.owners([p[0] for p in parsed if not isinstance(p, errors.XceError)])  # one read
        expanded = []
        for ref in parsed:
            if isinstance(ref, errors.XceError):
                raise ref
            job_id, index = ref
            owner = owners.get(job_id)
            if owner is None:  # retention may have archived it (controller.keep_finished)
                raise errors.NotFound(f"no such job: {job_id} (a job that ended more than keep_finished ago "
                                      f"is archived: `xce hist {job_id}` shows it)")
            if index is not None:
                element = self.store.element(job_id, int(index)) if owner[1] == job_id else None
                if element is None:
                    raise errors.NotFound(f"no such job: {job_id}[{index}]")
                expanded.append((f"{job_id}[{index}]", [element], False))
            elif owner[1] == job_id:
                expanded.append((str(job_id), self.store.element_ids(job_id), True))
            else:
                expanded.append((str(job_id), [job_id], False))
        return expanded


def _parse_ref(value: Any) -> tuple[int, str | None]:
    """A job reference's (job id, element index as written or None); SpecError or NotFound."""
    match = _REF.fullmatch(str(value)) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    if match is None:
        raise errors.SpecError(f"{value!r} is not a job: give its id (42) or an array element (42[7])")
    job_id, index = int(match[1]), match[2]
    if job_id >= 1 << 63 or (index is not None and int(index) >= 1 << 63):  # beyond SQLite's integers
        raise errors.NotFound(f"no such job: {value}")
    return job_id, index


def _steps_matching(ref: deps.Ref, steps: dict[str, deps.Target], text: str) -> list[deps.Target]:
    import fnmatch

    pattern = ref.name or ""
    names = [n for n in steps if fnmatch.fnmatchcase(n, pattern)] if "*" in pattern else \
        [pattern] if pattern in steps else []
    if not names:
        raise errors.SpecError(f"-w at position {ref.pos + 1}: {ref.name!r} names no earlier step of this flow")
    if ref.index is not None:
        raise errors.SpecError(f"-w: {ref.text()}: name a whole step in a flow, not one element")
    return [replace(steps[n], label=n) for n in names]
