"""Projects and fair share in the simulator: the controller's own policy (sched/projects.py,
sched/fairshare.py), fed from the simulated jobs as the controller feeds it from its store.

What the controller does, and so this does: a job's project is resolved and checked at submit
(`Projects.resolve`: -P, else a group default, else the cluster default; a simulated user is in no
Unix group) and a request no project limit could ever allow is refused (`Projects.never`); each
session reads what running jobs hold per project and, for fair-share queues, each entity's decayed
usage (finished jobs in a `Book` per half-life, running jobs' time so far) and running slots.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.merge_values import Effective
from xce_lite.errors import SpecError
from xce_lite.models import JobSpec
from xce_lite.sched.fairshare import PROJECT, USER, Book, FairShareInput, QueueShare, usage_now
from xce_lite.sched.placement import JobRequest
from xce_lite.sched.projects import held, summed
from xce_lite.sched.reasons import FrozenMap


class SimProjects:
    def __init__(self, config: ClusterConfig, now: float = 0.0) -> None:
        self.view = config.project_view()
        self.fair = [(q.name, q.fairshare.policy()) for q in config.queues if q.fairshare is not None]
        self.books = {policy.half_life: Book(policy.half_life, now) for _name, policy in self.fair}

    def admit(self, spec: JobSpec, user: str, eff: Effective) -> JobSpec:
        """The spec with its project resolved; SpecError as the controller would refuse it."""
        path = self.view.resolve(user, (), spec.project)
        why = self.view.never(JobRequest(0, eff.min_tasks, eff.max_tasks, eff.resreq), path)
        if why is not None:
            raise SpecError(why)
        return replace(spec, project=path)

    def finished(self, job) -> None:
        """A simulated job ended: its run joins the books."""
        if job.start is None or job.holding is None:
            return
        slots, gpus = _size(job)
        for book in self.books.values():
            book.add(job.entry.user, job.spec.project, job.start, job.end, slots, gpus)

    def inputs(self, running: list, now: float) -> dict[str, Any]:
        """What a Snapshot reads of projects and fair share, from the running simulated jobs."""
        inputs: dict[str, Any] = {}
        if not self.view.open:
            inputs["projects"] = self.view
            inputs["project_held"] = summed((job.spec.project, held(job.holding)) for job in running)
        if not self.fair:
            return inputs
        rows = [(job.entry.user, job.spec.project, job.start, *_size(job)) for job in running]
        slots: dict[str, dict[str, float]] = {USER: {}, PROJECT: {}}
        for user, project, _since, n, _gpus in rows:
            for by, entity in ((USER, user), (PROJECT, project or "")):
                slots[by][entity] = slots[by].get(entity, 0) + n
        books = {h: book.at(now) for h, book in self.books.items()}
        shares = tuple(QueueShare(name, policy, usage_now(policy, books[policy.half_life], rows, now))
                       for name, policy in self.fair)
        inputs["fairshare"] = FairShareInput(shares, FrozenMap({by: FrozenMap(m) for by, m in slots.items()}))
        return inputs


    def state(self) -> dict:
        """The books, for a simulation's `state()`: {half-life: [ref, [[by, entity, slot-s, gpu-s], ...]]}."""
        return {str(h): [b.ref, [[by, e, v[0], v[1]] for (by, e), v in sorted(b.values.items())]]
                for h, b in self.books.items()}

    def restore(self, state: dict) -> None:
        for key, (ref, values) in state.items():
            book = self.books.get(float(key))
            if book is not None:
                book.ref = ref
                book.values = {(by, e): [slot_s, gpu_s] for by, e, slot_s, gpu_s in values}


def _size(job) -> tuple[int, int]:
    return (sum(a.tasks for a in job.holding.allocs), sum(len(a.gpus) for a in job.holding.allocs))
