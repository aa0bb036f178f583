"""store/workflows.py on a real SQLite file: arrays stored once with one row per element, names for
`-w`, the facts dependencies are evaluated against, cancels, retries in the history, and flows."""

from __future__ import annotations

from pathlib import Path


from tests.support.store import T, spec
from xce_lite.models import DONE, EXIT, PEND, RUN
from xce_lite.store.jobs import Finish, JobStore, Requeue, TickWrites
from xce_lite.store.workflows import FlowRecord, FlowStep, NewJob
from xce_lite.workflow import deps_eval

BIG_ENV = {f"VAR{i}": "x" * 100 for i in range(30)}


def test_an_array_is_stored_once_and_each_element_is_a_job_of_its_own(store: JobStore, tmp_path: Path):
    before = store.submit([(spec(name="first"), "normal")], "alice", T)
    sims = spec(name="sims", array="[1-3,7]%2", env=BIG_ENV)
    (array_id,) = store.submit([NewJob(sims, "normal", (1, 2, 3, 7))], "alice", T + 1)
    after = store.submit([(spec(), "normal")], "alice", T + 2)
    assert before == [1] and array_id == 2 and after == [6]  # the elements took ids 2..5
    elements = store.jobs(store.element_ids(array_id))
    assert [(j.id, j.array_id, j.array_index, j.state, j.display_id) for j in elements] == [
        (2, 2, 1, PEND, "2[1]"), (3, 2, 2, PEND, "2[2]"), (4, 2, 3, PEND, "2[3]"), (5, 2, 7, PEND, "2[7]")]
    assert all(j.spec == sims for j in elements) and elements[0].spec is elements[3].spec
    assert elements[3].output_path() == "/home/alice/xce-2_7.out"
    # the environment is stored once, not per element
    con = store._reader()
    assert con.execute("SELECT count(*) FROM jobs WHERE spec LIKE '%VAR1%'").get == 0
    assert con.execute("SELECT count(*) FROM arrays WHERE spec LIKE '%VAR1%'").get == 1
    assert [e[1] for e in store.events(5)] == ["submitted"]
    assert [j.id for j in store.jobs(user="alice", elements=False)] == [1, 6]
    summary = store.array_summaries(user="alice")
    assert summary == [{"id": 2, "user": "alice", "queue": "normal", "name": "sims", "indices": "[1-3,7]%2",
                        "size": 4, "states": {PEND: 4}, "submit_time": T + 1, "project": None}]


def test_reads_by_id_take_more_ids_than_sqlite_takes_parameters(store: JobStore):
    """`xce wait` on four arrays of 10,000 (the largest) names 40,000 ids: one query would bind 40,000
    parameters, past SQLite's 32,766."""
    arrays = [store.submit([NewJob(spec(array="[1-10000]"), "q", tuple(range(1, 10_001)))], "alice", T)[0]
              for _ in range(4)]
    ids = [i for array_id in arrays for i in store.element_ids(array_id)]
    assert len(ids) == 40_000
    assert [j.id for j in store.jobs(ids[::-1] + ids[:5])] == sorted(ids)  # in id order, each once
    assert [j.id for j in store.jobs(ids, limit=3)] == sorted(ids)[:3]
    counts = store.states_of(ids + [10**9])
    assert counts == {(array_id, PEND): 10_000 for array_id in arrays}
    assert store.jobs(ids, states=(PEND,), limit=1)[0].id == min(ids) and not store.jobs(ids, states=("DONE",))
    owners = store.owners(ids)
    assert len(owners) == 40_000 and owners[ids[-1]] == ("alice", arrays[-1], 10_000)


def test_names_resolve_to_the_users_most_recent_job_and_wildcards_to_each_name(store: JobStore):
    old, other, new = store.submit([(spec(name="prep"), "q"), (spec(name="post"), "q"), (spec(name="prep"), "q")],
                                   "alice", T)
    (bobs,) = store.submit([(spec(name="prep"), "q")], "bob", T)
    (sims,) = store.submit([NewJob(spec(name="sims", array="[1-2]"), "q", (1, 2))], "alice", T)
    assert store.latest_named("alice", "prep") == (new, None)
    assert store.latest_named("bob", "prep") == (bobs, None)
    assert store.latest_named("alice", "sims") == (sims + 1, sims)
    assert store.latest_named("alice", "nothing") is None
    assert store.named_like("alice", "p*") == [("post", other, None), ("prep", new, None)]
    assert store.named_like("alice", "s?ms") == []  # ? is a plain character, only * is a wildcard
    assert store.element(sims, 2) == sims + 1 and store.element(sims, 3) is None
    assert store.owner(bobs) == ("bob", None, None) and store.owner(sims + 1) == ("alice", sims, 2)
    assert old < new


def test_group_rows_are_what_dependencies_see(store: JobStore):
    (a,) = store.submit([(spec(), "q")], "alice", T)
    (arr,) = store.submit([NewJob(spec(array="[1-3]"), "q", (1, 2, 3))], "alice", T)
    store.dispatch([(a, 1, [["h", 1]], "u-a"), (arr, 1, [["h", 1]], "u-b")], T)
    store.started([(a, T), (arr, T)], T)
    store.finish([Finish(a, RUN, EXIT, T, T + 1, 3, None, None, None, None),
                  Finish(arr, RUN, DONE, T, T + 1, 0, None, None, None, None)], T + 1)
    rows = store.group_rows([a], [arr])
    facts = {key: deps_eval.group_facts(value) for key, value in rows.items()}
    assert facts[(a, False)] == deps_eval.GroupFacts(1, ((EXIT, 1),), 1, 0, ((3, 1),))
    assert facts[(arr, True)] == deps_eval.GroupFacts(3, ((DONE, 1), (PEND, 2)), 1, 0, ())


def test_a_cancel_ends_a_pending_job_with_its_reason_and_event(store: JobStore):
    a, b = store.submit([(spec(), "q"), (spec(), "q")], "alice", T)
    store.dispatch([(b, 1, [["h", 1]], "u-b")], T)
    record = store.record_tick(TickWrites(T + 1, cancels=[(a, PEND, "dependency done(5) can never hold"),
                                                          (b, PEND, "stale")]))
    assert record.cancelled == (a,)
    job = store.get(a)
    assert (job.state, job.reason, job.end_time, job.start_time) == (EXIT, "dependency done(5) can never hold",
                                                                     T + 1, None)
    assert store.events(a)[-1] == (T + 1, "dependency_failed", {"from": PEND, "reason": job.reason})


def test_a_retry_is_a_requeue_that_counts_and_keeps_the_attempts_outcome(store: JobStore):
    (a,) = store.submit([(spec(), "q")], "alice", T)
    store.dispatch([(a, 1, [["h", 1]], "u-1")], T)
    store.started([(a, T)], T)
    result = {"exit_code": 3, "signal": None, "end_time": T + 2}
    assert store.requeue([Requeue(a, RUN, "attempt 1 failed: exit code 3", retry=True, result=result)], T + 2) == [a]
    job = store.get(a)
    assert (job.state, job.retries, job.attempt) == (PEND, 1, 1)
    assert store.events(a)[-1][2] == {"from": RUN, "to": PEND, "reason": "attempt 1 failed: exit code 3",
                                      "retry": True, "result": result}


def test_a_flow_records_its_steps_with_their_jobs_and_dependencies_by_id(store: JobStore):
    items = [NewJob(spec(name="prep"), "q"), NewJob(spec(name="sims", array="[1-2]"), "q", (1, 2)),
             NewJob(spec(name="collect"), "q")]
    flow = FlowRecord("pipe", (FlowStep("prep", False, None, ()), FlowStep("sims", True, "done(prep)", ("prep",)),
                               FlowStep("collect", False, "done(sims)", ("sims",))))

    def depends(ids):
        return [None, {"c": "done", "id": ids[0]}, {"c": "done", "id": ids[1], "array": True}]

    ids = store.submit(items, "alice", T, depends=depends, flow=flow)
    assert ids == [1, 2, 4]
    assert store.get(4).depend == {"c": "done", "id": 2, "array": True}
    assert store.get(3).depend == {"c": "done", "id": 1}  # an element's is its array's
    view = store.flow("alice", "pipe")
    assert [(s.step, s.is_array, s.depend, s.upstream, job_id) for s, job_id in view.steps] == [
        ("prep", False, None, (), 1), ("sims", True, "done(prep)", ("prep",), 2),
        ("collect", False, "done(sims)", ("sims",), 4)]
    assert store.flow("bob", "pipe") is None and store.flow_names("alice") == ["pipe"]
