"""sched/prefill_rank.py (issue 18, prefill at 10,000 pending): the pending jobs kept in a dispatch's
order from one session to the next, changed only where jobs changed, give successors() and
outranked() exactly the answers of their plain path (a sort of the whole snapshot, every job tried
against every unit: no shape passed over as refused by all), over random busy clusters reached
through random adds, replacements and removals."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.prefill_history import histories, plain_order, synced, units_on
from tests.support.sched import QUEUES, budgets, job
from xce_lite.controller.pending_set import PendingSet
from xce_lite.sched import prefill, prefill_rank
from xce_lite.sched.core import schedule
from xce_lite.sched.prefill import QueuedSuccessor, outranked, successors
from xce_lite.sched.prefill_rank import Ranked


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data(), histories(), st.one_of(st.just(1_000_000), budgets))
def test_the_kept_order_names_the_same_successors_and_withdrawals_as_the_plain_sort(data, history, budget):
    snapshot, steps = history
    priority = {q.name: q.priority for q in snapshot.queues}
    ranked = synced(steps, snapshot.jobs, priority)
    decisions = schedule(snapshot, budget)
    bare = replace(snapshot, jobs=())  # what prefilling.py passes: the jobs are the Ranked's
    running = data.draw(units_on(snapshot))
    examined = data.draw(st.sampled_from((prefill_rank.REBUILD, 1_000, 2)))
    fast = successors(bare, decisions, running, examined, ranked=ranked)
    with mock.patch.object(prefill._Room, "hopeless", lambda _room, _job: False):  # the plain path
        assert fast == successors(snapshot, decisions, running, examined)
    queued = tuple(QueuedSuccessor(job(2_000 + i, slots=data.draw(st.integers(1, 3)),
                                       queue=data.draw(st.sampled_from(QUEUES))), u.host, u.job_id)
                   for i, u in enumerate(running))
    placed = frozenset(data.draw(st.sets(st.sampled_from([j.id for j in snapshot.jobs])))
                       if snapshot.jobs else ())
    predecessors = tuple(replace(u, taken=True) for u in running)
    fast_out = outranked(bare, decisions, queued, predecessors, placed, examined, ranked=ranked)
    with mock.patch.object(prefill._Room, "hopeless", lambda _room, _job: False):
        assert fast_out == outranked(snapshot, decisions, queued, predecessors, placed, examined)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("add", "add", "replace", "discard", "priorities", "many")),
                          st.integers(1, 40), st.sampled_from((0, 5, 9)), st.sampled_from(QUEUES)), max_size=40))
def test_the_order_follows_each_add_replacement_removal_and_new_priorities(ops):
    pending, ranked = PendingSet(), Ranked()
    changed = pending.watch()
    priority = {"high": 3, "normal": 2, "low": 1}
    for op, job_id, sp, queue in ops:
        if op in ("add", "replace") and (op == "add" or job_id in pending):
            pending.add(replace(job(job_id, queue=queue), priority=sp))
        elif op == "discard":
            pending.discard(job_id)
        elif op == "priorities":
            priority = {**priority, queue: sp}
        elif op == "many":  # a submission past REBUILD: sorted anew
            fresh = [job(100 + job_id * 200 + i, queue=queue) for i in range(prefill_rank.REBUILD + 1)]
            if not any(j.id in pending for j in fresh):
                pending.add_all(fresh)
        ranked.sync(pending, changed, priority)
        changed.clear()
        assert [j.id for j in ranked] == plain_order(pending.values(), priority)
        assert all(ranked.get(j.id) is j for j in pending.values())


def test_a_reset_sorts_everything_again_and_a_pending_set_tells_each_change():
    pending, ranked = PendingSet(), Ranked()
    changed = pending.watch()
    pending.add_all([job(3), job(1), job(2)])
    pending.add(replace(job(2), priority=5))  # replaced
    pending.discard(1)
    assert changed == {1: None, 2: None, 3: None} and len(pending) == 2  # none was pending before
    ranked.sync(pending, changed, {"normal": 30})
    changed.clear()
    assert [j.id for j in ranked] == [2, 3]
    first = pending.get(2)
    pending.add(job(2))  # each change is told with the job as it was at the last sync
    pending.discard(2)
    pending.add(job(4))
    pending.discard(3)
    assert changed == {2: first, 3: job(3), 4: None}
    ranked.sync(pending, changed, {"normal": 30})
    changed.clear()
    assert [j.id for j in ranked] == [4]
    pending.add(replace(job(2), priority=5))
    pending.add(job(3))
    ranked.sync(pending, changed, {"normal": 30})
    changed.clear()
    assert [j.id for j in ranked] == [2, 3, 4]
    pending.add(job(1))
    changed.clear()  # this change went uncounted (prefilling.extend when prefill is off) ...
    assert [j.id for j in ranked] == [2, 3, 4]
    ranked.reset()  # ... so the next sync sorts everything
    ranked.sync(pending, changed, {"normal": 30})
    assert [j.id for j in ranked] == [2, 1, 3, 4] and len(ranked) == 4
    pending.add(job(0))
    changed.clear()  # uncounted again, and not reset: the job it is told left next was never kept,
    pending.discard(0)  # so it sorts everything rather than take out the job where 0 would be (1)
    ranked.sync(pending, changed, {"normal": 30})
    assert [j.id for j in ranked] == [2, 1, 3, 4] and len(ranked) == 4
