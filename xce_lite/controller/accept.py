"""Accepting a submission's specs (POST /jobs): checked and merged once per distinct spec, and put on
the pending path in one step.

Invariants: all or nothing (the first spec refused refuses the request, naming its position); what
is stored, answered and pending is what checking each spec alone gave (tests/controller/
test_accept_bytes.py). It is only cheaper: specs of one request equal in value and type are one
spec (one check of the spec, its queue, project, paths and dependency; one merge; one JSON text in
the store), since nothing those checks read changes within the request; an array's elements, and a
batch's jobs of one spec and queue, share one merge for the scheduler's view, each with its own id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.api.hygiene import unencodable
from xce_lite.controller.gating import Gating
from xce_lite.controller.pending_set import PendingSet
from xce_lite.models import JobSpec
from xce_lite.sched.core import PendingJob
from xce_lite.sched.placement import JobRequest
from xce_lite.store.workflows import NewJob
from xce_lite.workflow import arrays


Validate = Callable[[Any, Caller], tuple[JobSpec, str]]  # Submitting.validate: the spec and its queue's name
ResolveDepend = Callable[[JobSpec, str], dict | None]  # Gating.resolve_depend


def specs(raws: list, caller: Caller, validate: Validate, resolve_depend: ResolveDepend) -> list[NewJob]:
    """Each raw spec checked (`validate`), its dependency resolved and its array parsed; the
    same NewJob for equal specs. SpecError, prefixed `job N:` in a request of several."""
    many = len(raws) > 1
    seen: dict[str, NewJob] = {}
    accepted = []
    for index, raw in enumerate(raws):
        key = _key(raw) if many else None
        item = seen.get(key) if key is not None else None
        if item is None:
            try:
                spec, queue_name, depend = _one(raw, caller, validate, resolve_depend)
            except errors.SpecError as err:
                raise errors.SpecError(f"job {index + 1}: {err}" if many else str(err)) from None
            item = NewJob(spec, queue_name, arrays.parse(spec.array).indices if spec.array else (), depend)
            if key is not None:
                seen[key] = item
        accepted.append(item)
    return accepted


def _one(raw: Any, caller: Caller, validate: Validate, resolve_depend: ResolveDepend,
         ) -> tuple[JobSpec, str, dict | None]:
    bad = unencodable(raw)
    if bad is not None:
        raise errors.SpecError(
            f"{bad[0]} holds {bad[1]!r}: a lone surrogate, which is no text and no byte, so it cannot "
            f"reach the job; fix what produced it (undecodable bytes arrive as \\udc80-\\udcff, "
            f"which are accepted)")
    spec, queue_name = validate(raw, caller)
    return spec, queue_name, resolve_depend(spec, caller.user)


def _key(raw: Any) -> str | None:
    """The spec's repr: equal only for equal values of the same types (1, 1.0 and True differ, as
    they may to the checks), at half the cost of canonical JSON; None (checked on its own) for
    what is not a decoded JSON object."""
    return repr(raw) if type(raw) is dict else None


Templates = dict[tuple[int, str, str], tuple[JobSpec, PendingJob]]  # (id(spec), queue, user) -> the spec, its merge


def admit(gating: Gating, pending: PendingSet, ids: list[int], items: list[NewJob], user: str, now: float,
          kept: Templates | None = None) -> None:
    """The jobs just stored, on the pending path (`gating.admit`), the common ones in one step: a job
    or an array with no hold, dependency or throttle goes straight into the pending set, merged
    once per (spec, queue) of the request, or once for many requests: `kept` holds the merges of
    plain jobs across requests (the caller empties it when the configuration or profiles change;
    the spec is kept beside its id, so the id stays its own). Holds the state's lock."""
    templates: dict[tuple[int, str], PendingJob] = {}
    batch: list[PendingJob] = []
    run_of: PendingJob | None = None  # the template of `run`: neighbouring plain jobs of one (spec, queue)
    run: list[int] = []
    for job_id, item in zip(ids, items):
        spec = item.spec
        special = spec.hold or item.depend is not None or (spec.array and arrays.throttle_of(spec.array) is not None)
        if not item.indices and not special:
            template = templates.get((id(spec), item.queue))
            if template is None:
                found = kept.get((id(spec), item.queue, user)) if kept is not None else None
                if found is not None and found[0] is spec:
                    template = found[1]  # its id and submit time are each job's own in _clones
                else:
                    template = gating.pending_of(job_id, user, item.queue, spec, now, None)
                    if kept is not None:
                        kept[(id(spec), item.queue, user)] = (spec, template)
                templates[(id(spec), item.queue)] = template
            if template is not run_of:
                batch.extend(_clones(run_of, run, now) if run_of is not None else ())
                run_of, run = template, []
            run.append(job_id)
            continue
        if run_of is not None:  # the pending set keeps the submission's order
            batch.extend(_clones(run_of, run, now))
            run_of, run = None, []
        if special:
            pending.add_all(batch)
            batch = []
            gating.admit(job_id, item, user, now)
            continue
        elements = range(job_id, job_id + len(item.indices))
        # gating.note_element for each (new ids: none is known yet), in two steps instead of 1,000 calls
        gating.array_of.update(dict.fromkeys(elements, job_id))
        gating.array_left[job_id] += len(elements)
        template = gating.pending_of(job_id, user, item.queue, spec, now, job_id)  # the array's merge, kept
        batch.extend(_clones(template, elements, now))
    if run_of is not None:
        batch.extend(_clones(run_of, run, now))
    pending.add_all(batch)


def _clones(template: PendingJob, ids: Iterable[int], submit_time: float) -> list[PendingJob]:
    """`template` for each job of `ids` (its request's id too), as dataclasses.replace would make
    them, at a tenth of the cost: 1,000 elements cost ~15 ms that way, ~3.5 ms copying the fields
    one by one per job, ~1.5 ms thus (what is shared is read once, each job gets its own field
    dict and request). PendingJob is frozen: its fields are set as dataclasses' own __init__ does."""
    fields = dict(template.__dict__)
    fields["submit_time"] = submit_time
    shared = template.request
    low, high, resreq = shared.min_tasks, shared.max_tasks, shared.resreq
    new, put = object.__new__, object.__setattr__
    out = []
    for job_id in ids:
        request = new(JobRequest)
        put(request, "id", job_id)
        put(request, "min_tasks", low)
        put(request, "max_tasks", high)
        put(request, "resreq", resreq)
        job = new(PendingJob)
        own = job.__dict__
        own.update(fields)
        own["id"] = job_id
        own["request"] = request
        out.append(job)
    return out
