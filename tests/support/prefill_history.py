"""Shared by the prefill tests of the scheduler core (tests/sched: test_prefill_rank.py, test_prefill_memo.py):
random busy snapshots reached through random pending-set histories, a Ranked synced along them, and
running units on the snapshot's hosts."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from tests.support.sched import QUEUES, busy_snapshots, job
from xce_lite.controller.pending_set import PendingSet
from xce_lite.sched.core import PendingJob, Snapshot
from xce_lite.sched.prefill import RunningUnit
from xce_lite.sched.backlog import rank_of
from xce_lite.sched.prefill_rank import Ranked
from xce_lite.sched.reasons import FrozenMap


def plain_order(jobs, priority) -> list[int]:
    return [j.id for j in sorted(jobs, key=lambda j: rank_of(j, priority))]


@st.composite
def histories(draw: st.DrawFn) -> tuple[Snapshot, list[tuple[PendingJob, ...]]]:
    """A busy snapshot, and the pending sets a Ranked saw synced before it: jobs of it missing,
    others since gone, some with another -sp or queue (replaced since), in random steps."""
    snapshot = draw(busy_snapshots())
    final = list(snapshot.jobs)
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        kept = [j for j in final if draw(st.booleans())]
        others = [replace(j, priority=draw(st.sampled_from((0, 5, 9))), queue=draw(st.sampled_from(QUEUES)))
                  for j in final if draw(st.integers(0, 4)) == 0]
        gone = [job(500 + i, queue=draw(st.sampled_from(QUEUES))) for i in range(draw(st.integers(0, 3)))]
        steps.append(tuple({j.id: j for j in kept + others + gone}.values()))
    return snapshot, steps


def synced(steps: list[tuple[PendingJob, ...]], jobs: tuple[PendingJob, ...], priority: dict[str, int]) -> Ranked:
    """A Ranked synced after each of `steps` and then `jobs`, told only the ids that changed, as
    controller/pending_set.PendingSet.watch collects them."""
    pending, ranked = PendingSet(), Ranked()
    changed = pending.watch()
    for state in [*steps, jobs]:
        ids = {j.id for j in state}
        for job_id in list(pending):
            if job_id not in ids:
                pending.discard(job_id)
        fresh = [j for j in state if pending.get(j.id) is not j]
        if len(fresh) > 1 and not any(j.id in pending for j in fresh):
            pending.add_all(fresh)
        for j in fresh:
            if pending.get(j.id) is not j:
                pending.add(j)
        ranked.sync(pending, changed, priority)
        changed.clear()
    assert [j.id for j in ranked] == plain_order(jobs, priority)
    return ranked


@st.composite
def units_on(draw: st.DrawFn, snapshot: Snapshot) -> tuple[RunningUnit, ...]:
    """Running units on the snapshot's hosts, each holding part of its host (ids 1,000 on)."""
    out = []
    for i, h in enumerate(draw(st.lists(st.sampled_from(snapshot.hosts), max_size=5)) if snapshot.hosts else ()):
        # mostly the whole host (so that many jobs fit inside), else a part of it
        reserved = {k: draw(st.sampled_from((v, v, v // 2))) for k, v in h.total.items() if k != "gpus"}
        gpus = tuple(range(draw(st.integers(0, h.total.get("gpus", 0)))))
        queue, user = draw(st.sampled_from(QUEUES)), draw(st.sampled_from(("alice", "bob")))
        out.append(RunningUnit(1_000 + i, h.name, queue, user, FrozenMap({**reserved, "gpus": len(gpus)}), gpus,
                               draw(st.booleans())))
    return tuple(out)
