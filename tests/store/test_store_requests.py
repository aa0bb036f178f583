"""Request ids on real SQLite files (store/requests.py): a flow's is kept with its reply and answers
a repeat without storing twice; ids older than `controller.keep_requests` are forgotten in bounded
batches, by the store and by the tick's retention step, while newer ones still answer."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from tests.support.store import DATA, T, spec
from xce_lite.config.cluster import ControllerConfig
from xce_lite.controller.retention import Retention
from xce_lite.errors import SpecError, StoreUnavailable
from xce_lite.store.jobs import JobStore
from xce_lite.store.workflows import FlowRecord, FlowStep, NewJob

DAY = 86400.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(tmp_path / "jobs.db")
    yield s
    s.close()


def submit_flow(store: JobStore, request_id: str, now: float, name: str = "f", user: str = "alice"):
    items = [NewJob(spec("true"), "normal"), NewJob(spec("true"), "normal", (1, 2))]
    flow = FlowRecord(name, (FlowStep("a", False, None, ()), FlowStep("b", True, "done(a)", ("a",))))

    def reply(ids: list[int]) -> dict:
        return {"flow": name, "steps": [{"step": s, "id": i} for s, i in zip("ab", ids)], "kept": []}

    return store.submit_flow_once(items, user, now, request_id, None, flow, reply)


def test_a_flow_request_id_answers_its_first_reply_and_stores_nothing_twice(store: JobStore) -> None:
    first, new = submit_flow(store, "req-flow-1", T)
    assert new and first == {"flow": "f", "steps": [{"step": "a", "id": 1}, {"step": "b", "id": 2}], "kept": []}
    again, new_again = submit_flow(store, "req-flow-1", T + 5)
    assert (again, new_again) == (first, False)
    assert store.flow_submitted("req-flow-1", "alice") == first and store.flow_submitted("other-1", "alice") is None
    assert len(store.flow_names("alice")) == 1 and len(store.jobs(include_finished=True)) == 3  # a job, 2 elements
    with pytest.raises(SpecError, match="another user's submission"):
        submit_flow(store, "req-flow-1", T + 6, user="bob")
    with pytest.raises(SpecError, match="was used for a flow submission"):
        store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 7, "req-flow-1")
    store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 8, "req-jobs-1")
    with pytest.raises(SpecError, match="was used for a job submission"):
        submit_flow(store, "req-jobs-1", T + 9)
    assert len(store.jobs(include_finished=True)) == 4 and store.integrity() == "ok"


def test_old_request_ids_go_in_bounded_batches_newer_stay_and_still_answer(store: JobStore) -> None:
    for i in range(5):  # old: a day and more before the cutoff
        store.submit_once([NewJob(spec("true"), "normal")], "alice", T + i, f"old-jobs-{i}")
    submit_flow(store, "old-flow-1", T + 10)
    (kept,), _ = store.submit_once([NewJob(spec("true"), "normal")], "alice", T + DAY, "new-jobs-1")
    fresh, _ = submit_flow(store, "new-flow-1", T + DAY + 1)
    cutoff = T + DAY - 1
    assert [store.prune_requests(cutoff, 2) for _ in range(4)] == [2, 2, 2, 0]  # oldest first, then done
    assert store.request_count() == 2
    assert store.submitted("old-jobs-0", "alice") is None and store.flow_submitted("old-flow-1", "alice") is None
    # the newer ones still answer a repeat, and store nothing
    assert store.submit_once([NewJob(spec("true"), "normal")], "alice", T + DAY + 2, "new-jobs-1") == ([kept], False)
    assert submit_flow(store, "new-flow-1", T + DAY + 3) == (fresh, False)
    jobs = len(store.jobs(include_finished=True))
    # past the window an id is a new submission (a client retries for seconds, never for a day)
    assert store.submit_once([NewJob(spec("true"), "normal")], "alice", T + DAY + 4, "old-jobs-0")[1] is True
    assert len(store.jobs(include_finished=True)) == jobs + 1


def test_the_ticks_retention_step_forgets_request_ids_older_than_keep_requests(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    for i in range(30):
        store.submit_once([NewJob(spec("true"), "normal")], "alice", T + i, f"old-{i:04d}")
    (recent,), _ = store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 2 * DAY, "recent-0001")
    config = ControllerConfig(keep_requests="1d")
    assert ControllerConfig().keep_requests == DAY and config.keep_requests == DAY
    messages: list[str] = []
    step = Retention(messages.append, batch=20)
    step.step(store, config, T + 2.5 * DAY, busy=False)
    assert store.request_count() == 11  # one bounded batch
    step.step(store, config, T + 2.5 * DAY, busy=False)  # a full batch: the next one is due at once
    assert store.request_count() == 1 and store.submitted("recent-0001", "alice") == [recent]
    assert not messages  # nothing failed
    store.close()


def test_the_v1_store_gets_request_replies_and_prunes(tmp_path: Path) -> None:
    copy = tmp_path / "store_v1.db"
    shutil.copyfile(DATA / "store_v1.db", copy)
    store = JobStore(copy)
    try:
        first, _ = submit_flow(store, "v1-flow-0001", T + 100 * DAY)
        assert submit_flow(store, "v1-flow-0001", T + 100 * DAY) == (first, False)
        assert store.prune_requests(T + 101 * DAY, 10) == 1 and store.integrity() == "ok"
    finally:
        store.close()


class _Statements:
    """The store's writer connection, noting each statement handed to it."""

    def __init__(self, con) -> None:
        self.con, self.sql = con, []

    def execute(self, sql, *args, **kw):
        self.sql.append(sql)
        return self.con.execute(sql, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.con, name)


class _Full(_Statements):
    """The writer connection on a full disk: every statement that would write fails as SQLite says."""

    def execute(self, sql, *args, **kw):
        if "INSERT" in sql:
            raise apsw.FullError("database or disk is full")
        return super().execute(sql, *args, **kw)


def test_a_new_job_request_id_is_claimed_without_a_lookup_and_a_repeat_rolls_its_jobs_back(store: JobStore) -> None:
    written = store._con = _Statements(store._con)
    ids, new = store.submit_once([NewJob(spec("true"), "normal")], "alice", T, "req-claim-1")
    claims = [s for s in written.sql if "submit_requests" in s]  # one job: the claim is in the one script
    assert new and len(claims) == 1 and "FROM submit_requests" not in claims[0]
    assert "INSERT INTO submit_requests" in claims[0]
    # a repeat is answered with the first one's jobs; what it inserted before finding the id is gone
    assert store.submit_once([NewJob(spec("true"), "normal")] * 3, "alice", T + 1, "req-claim-1") == (ids, False)
    with pytest.raises(SpecError, match="another user's submission"):
        store.submit_once([NewJob(spec("true"), "normal")], "bob", T + 2, "req-claim-1")
    assert [j.id for j in store.jobs(include_finished=True)] == ids and store.request_count() == 1
    # a repeat of one job (its script's claim fails on the key) leaves nothing of its own either
    assert store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 1, "req-claim-1") == (ids, False)
    assert [j.id for j in store.jobs(include_finished=True)] == ids and store.integrity() == "ok"
    # the ids go on from the first submission's: nothing of the repeats was kept
    assert store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 3, "req-claim-2") == ([ids[0] + 1], True)
    assert store.integrity() == "ok"


def test_a_repeat_is_answered_while_the_store_refuses_writes(store: JobStore) -> None:
    ids, _ = store.submit_once([NewJob(spec("true"), "normal")], "alice", T, "req-full-1")

    store._con = _Full(store._con)  # the disk filled up after the first one
    assert store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 1, "req-full-1") == (ids, False)
    with pytest.raises(StoreUnavailable):  # a new one is refused, and says why
        store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 2, "req-full-2")
    with pytest.raises(SpecError, match="another user's submission"):
        store.submit_once([NewJob(spec("true"), "normal")], "bob", T + 3, "req-full-1")
