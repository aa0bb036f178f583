"""Retention and the accounting reads (store/archive.py, store/accounting.py) on real SQLite files.

The promise under test: retention moves only old finished jobs that nothing live reads, whole (row,
events, array, day sums), and `xce hist` and `xce acct` read the same numbers before and after.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from tests.support.store import DATA, T, V1_JOBS, raw, spec
from xce_lite import accounting
from xce_lite.models import DONE, EXIT, PEND, RUN
from xce_lite.store.jobs import Finish, JobStore, TickWrites
from xce_lite.store.workflows import FlowRecord, FlowStep, NewJob

DAY = 86400.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(tmp_path / "jobs.db")
    yield s
    s.close()


def run(store: JobStore, user: str, submit: float, wait: float, run_for: float, state: str = DONE,
        host: str = "h1", tasks: int = 1, gpus: int = 0, cpu: float | None = 1.0, queue: str = "normal",
        item: NewJob | None = None) -> int:
    """A job that waited `wait` s, then ran `run_for` s on `host` with `tasks` slots and `gpus` GPUs."""
    (job_id,) = store.submit([item or NewJob(spec("true"), queue)], user, submit)
    alloc = {"allocs": [[host, tasks, {"slots": tasks}, list(range(gpus))]], "shared": {}}
    assert store.dispatch([(job_id, 1, [[host, tasks]], f"u-{job_id}", alloc, None)], submit + wait) == [job_id]
    assert store.started([(job_id, submit + wait)], submit + wait) == [job_id]
    end = submit + wait + run_for
    code = 0 if state == DONE else 3
    assert store.finish([Finish(job_id, RUN, state, None, end, code, None, cpu, 1000 * job_id,
                                None if state == DONE else "exit code 3")], end) == [job_id]
    return job_id


def acct(store: JobStore, by: str = "user", since: float = 0.0, until: float = T + 400 * DAY) -> dict:
    groups = accounting.summarise(*store.accounting_inputs(by, since, until))
    return {key: tally.report() for key, tally in groups.items()}


def without_exactness(report: dict) -> dict:
    return {k: {**v, "wait": {**v["wait"], "exact": None, "median": None, "p95": None}} for k, v in report.items()}


def test_retention_moves_only_old_finished_jobs_and_accounting_reads_the_same(store: JobStore) -> None:
    old = [run(store, "alice", T + i * 600, 5 + i, 100 + i, tasks=2, gpus=1) for i in range(5)]
    old.append(run(store, "bob", T + 4000, 1, 50, state=EXIT, cpu=None))
    (pending,) = store.submit([(spec("sleep", "1"), "normal")], "bob", T + 5000)
    (running,) = store.submit([(spec("sleep", "2"), "normal")], "bob", T + 5000)
    store.dispatch([(running, 1, [["h1", 1]], "u-r")], T + 5001)
    store.started([(running, T + 5001)], T + 5001)
    recent = run(store, "alice", T + 40 * DAY, 2, 10)
    before = acct(store)
    history_before = store.history([*old, recent])[0]

    moved = store.retain(cutoff=T + 30 * DAY, batch=1000)
    assert (moved.jobs, moved.more) == (len(old), False)
    live = {j.id: j.state for j in store.jobs(include_finished=True)}
    assert live == {pending: PEND, running: RUN, recent: DONE}
    assert store.retain(cutoff=T + 30 * DAY, batch=1000).jobs == 0  # nothing left to move
    # every number the same (alice's waits now partly come from day sums: median within a bucket)
    after = acct(store)
    assert without_exactness(after) == without_exactness(before)
    assert after["alice"]["slot_hours"] == round(sum((100 + i) * 2 for i in range(5)) / 3600 + 10 / 3600, 4)
    assert after["alice"]["gpu_hours"] == round(sum(100 + i for i in range(5)) / 3600, 4)
    assert (before["bob"]["wait"]["exact"], after["bob"]["wait"]["exact"]) == (True, False)  # from a day sum now
    assert abs(after["bob"]["wait"]["median"] - 1.0) <= 0.1  # within its bucket
    history_after = store.history([*old, recent])[0]
    assert [j["archived"] for j in history_after] == [True] * len(old) + [False]
    for a, b in zip(history_before, history_after):
        assert {**a, "archived": None} == {**b, "archived": None}
    assert [kind for _t, kind, _d in history_after[0]["events"]] == ["submitted", "dispatched", "started", "finished"]


def test_a_window_inside_days_reads_archived_jobs_one_by_one(store: JobStore) -> None:
    ids = [run(store, "alice", T + i * 3 * 3600, 10, 60) for i in range(24)]  # over three days
    run(store, "alice", T + 40 * DAY, 1, 1)  # the newest job stays live
    since, until = T + 5 * 3600, T + 50 * 3600
    expected = acct(store, since=since, until=until)
    assert store.retain(T + 30 * DAY, 1000).jobs == len(ids)
    got = acct(store, since=since, until=until)
    assert without_exactness(got) == without_exactness(expected)
    got = got["alice"]
    assert abs(got["wait"]["median"] - 10.0) <= 1.0  # a histogram bucket is ~19% wide


def test_retention_is_bounded_by_batch_and_never_reuses_ids(store: JobStore) -> None:
    ids = [run(store, "alice", T + i, 1, 1) for i in range(7)]
    first = store.retain(T + DAY, batch=3)
    assert (first.jobs, first.more) == (3, True)
    assert store.retain(T + DAY, batch=3).jobs == 3
    assert store.retain(T + DAY, batch=3).jobs == 1
    assert store.jobs(include_finished=True) == []
    (new,) = store.submit([(spec("true"), "normal")], "alice", T + 2 * DAY)
    assert new == ids[-1] + 1  # after the archived ones, though the live table was empty
    # a late event (a host's hooks) for an archived job joins its archived history
    store.record_tick(TickWrites(T + 2 * DAY, events=[(ids[0], "host_hooks", {"host": "h2"}),
                                                      (12345, "host_hooks", {"host": "h2"})]))
    (job,), _more = store.history([ids[0]])
    assert [e[1] for e in job["events"]][-2:] == ["finished", "host_hooks"]


def test_events_leave_only_through_the_archive_and_never_for_a_live_job(store: JobStore) -> None:
    done = run(store, "alice", T, 1, 1)
    (pending,) = store.submit([(spec("true"), "normal")], "alice", T + 1)
    con = raw(store.path)
    try:
        for job_id in (done, pending):  # not archived: refused, finished or not
            with pytest.raises(apsw.ConstraintError, match="append-only"):
                con.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
        # a copy in the archive does not free a live job's events
        con.execute("INSERT INTO events_archive SELECT seq, job_id, time, kind, version, data FROM events "
                    "WHERE job_id = ?", (pending,))
        with pytest.raises(apsw.ConstraintError, match="append-only"):
            con.execute("DELETE FROM events WHERE job_id = ?", (pending,))
    finally:
        con.close()


def test_arrays_flows_and_dependencies_keep_what_live_jobs_read(store: JobStore) -> None:
    a = run(store, "alice", T, 1, 1)  # an unfinished job depends on it
    store.submit([NewJob(spec("true"), "normal", depend={"c": "done", "id": a, "label": str(a)})], "alice", T + 1)
    (array,) = store.submit([NewJob(spec("true", array="[1-2]"), "normal", (1, 2))], "alice", T + 2)
    store.dispatch([(array, 1, [["h1", 1]], "u-e1")], T + 3)
    store.finish([Finish(array, "DISP", EXIT, None, T + 4, None, None, None, None, "launch failed")], T + 4)
    step = FlowStep("s", False, None, ())
    (flowed,) = store.submit([NewJob(spec("true"), "normal")], "alice", T + 5, flow=FlowRecord("f", (step,)))
    store.dispatch([(flowed, 1, [["h1", 1]], "u-f")], T + 6)
    store.finish([Finish(flowed, "DISP", EXIT, None, T + 7, None, None, None, None, "x")], T + 7)
    (newest,) = store.submit([(spec("true"), "normal")], "alice", T + 8)
    assert store.retain(T + DAY, 100).jobs == 0  # a: depended on; the element: its sibling pends; flowed: its flow
    store.change_state([array + 1], PEND, EXIT, "killed_pending", T + 9, end_time=T + 9)
    store.change_state([newest + 0], PEND, EXIT, "killed_pending", T + 10, end_time=T + 10)
    (store.submit([(spec("true"), "normal")], "alice", T + 11))
    moved = store.retain(T + DAY, 100)
    # both elements and their array go; the flow is the newest flow, so it and its job stay
    assert moved.jobs == 3 and moved.flows == 0
    left = {j.id for j in store.jobs(include_finished=True)}
    assert array not in left and array + 1 not in left and a in left and flowed in left
    assert store.array_summaries([array]) == []
    elements, _more = store.history(arrays=[array])
    assert [(j["id"], j["array_index"], j["archived"]) for j in elements] == [(array, 1, True), (array + 1, 2, True)]


def test_a_flow_goes_with_its_jobs_once_a_newer_flow_exists(store: JobStore) -> None:
    ids = []
    for name in ("f1", "f2"):
        (job_id,) = store.submit([NewJob(spec("true"), "normal")], "alice", T,
                                 flow=FlowRecord(name, (FlowStep("s", False, None, ()),)))
        store.dispatch([(job_id, 1, [["h1", 1]], f"u-{job_id}")], T + 1)
        store.finish([Finish(job_id, "DISP", EXIT, None, T + 2, None, None, None, None, "x")], T + 2)
        ids.append(job_id)
    store.submit([(spec("true"), "normal")], "alice", T + 3)
    moved = store.retain(T + DAY, 100)
    assert (moved.flows, moved.jobs) == (1, 1)
    assert store.flow("alice", "f1") is None and store.flow("alice", "f2") is not None


def test_pruning_keeps_the_day_sums(store: JobStore) -> None:
    for i in range(10):
        run(store, "alice", T + i * 60, 3, 30, tasks=4)
    run(store, "alice", T + 100 * DAY, 1, 1)
    store.retain(T + DAY, 100)
    before = acct(store, until=T + 50 * DAY)
    assert store.prune_archive(T + 10 * DAY, 100) == 10
    assert store.history(user="alice")[0][0]["id"] == 11  # only the live one left to show
    assert acct(store, until=T + 50 * DAY) == before


def test_the_v1_store_retains_its_finished_jobs(tmp_path: Path) -> None:
    copy = tmp_path / "store_v1.db"
    shutil.copyfile(DATA / "store_v1.db", copy)
    store = JobStore(copy)
    try:
        finished = sorted(i for i, v in V1_JOBS.items() if v[0] in (DONE, EXIT))
        moved = store.retain(T + 30 * DAY, 100)
        assert moved.jobs == len(finished)
        assert sorted(j["id"] for j in store.history(finished)[0] if j["archived"]) == finished
        assert [j.id for j in store.unfinished()] == [1, 2, 3, 4, 5, 6, 12]
        assert store.integrity() == "ok"
    finally:
        store.close()


@pytest.mark.parametrize("text, expected", [
    ("now", T), ("7d", T - 7 * DAY), ("12h", T - 12 * 3600), ("30m", T - 1800), ("2w", T - 14 * DAY),
])
def test_times_users_type(text: str, expected: float) -> None:
    assert accounting.parse_when(text, T) == expected


def test_times_by_the_calendar() -> None:
    today = accounting.parse_when("today", T)
    assert accounting.parse_when("yesterday", T) < today <= T < today + DAY + 3600
    noon = accounting.parse_when("2026-11-30T13:00", T)
    assert accounting.parse_when("2026-11-30", T) == accounting.local_midnight(noon)
    with pytest.raises(Exception, match="not a time: give an ISO date"):
        accounting.parse_when("last tuesday", T)


def test_percentiles_are_nearest_rank_and_the_histogram_is_close() -> None:
    waits = [float(w) for w in range(1, 101)]
    assert (accounting.percentile(waits, 50), accounting.percentile(waits, 95)) == (50.0, 95.0)
    hist = [0] * accounting.BUCKETS
    for w in waits:
        hist[accounting.wait_bucket(w)] += 1
    assert abs(accounting.hist_percentile(hist, 50) - 50) / 50 < 0.1  # a bucket is 2^(1/4) wide
    assert abs(accounting.hist_percentile(hist, 95) - 95) / 95 < 0.1
    assert accounting.wait_bucket(10**9) == accounting.BUCKETS - 1 and accounting.wait_bucket(0.001) == 0


def test_the_dashboards_usage_per_day_counts_archived_jobs_too(store: JobStore) -> None:
    for i in range(6):
        run(store, ("alice", "bob")[i % 2], T + i * 3600, 2, 600, tasks=2, state=DONE if i % 3 else EXIT)
    run(store, "alice", T + 40 * DAY, 1, 1)
    before = store.usage_by_day(T - DAY)
    assert store.retain(T + 30 * DAY, 100).jobs == 6
    assert store.usage_by_day(T - DAY) == before


def test_keep_archived_is_never_shorter_than_keep_finished() -> None:
    from pydantic import ValidationError

    from xce_lite.config.cluster import ControllerConfig

    assert (ControllerConfig().keep_finished, ControllerConfig().keep_archived) == (30 * DAY, 365 * DAY)
    assert ControllerConfig(keep_finished="2d", keep_archived="7d").keep_archived == 7 * DAY
    with pytest.raises(ValidationError, match="keep_archived must be at least keep_finished"):
        ControllerConfig(keep_finished="30d", keep_archived="1d")


def test_the_ticks_step_drains_a_backlog_in_batches_and_survives_a_failing_store(tmp_path: Path) -> None:
    import threading

    from xce_lite.config.cluster import ControllerConfig
    from xce_lite.controller.retention import MIN_BATCH, Retention

    store = JobStore(tmp_path / "jobs.db")
    for i in range(3 * MIN_BATCH):
        run(store, "alice", T + i, 1, 1)
    messages: list[str] = []
    woken = threading.Event()
    step = Retention(messages.append, woken.set, batch=MIN_BATCH)
    config = ControllerConfig()
    now = T + 40 * DAY
    step.step(store, config, now, busy=False)
    assert len(store.jobs(include_finished=True)) == 2 * MIN_BATCH  # one batch, no more
    assert woken.wait(10)  # a full batch: the tick is woken for the next one
    step.step(store, config, now, busy=True)  # the tick had its own work to commit: retention waits
    assert len(store.jobs(include_finished=True)) == 2 * MIN_BATCH
    while store.jobs(include_finished=True):
        step.step(store, config, now, busy=False)
    assert step.moved == 3 * MIN_BATCH and step.batch >= MIN_BATCH
    step.step(store, config, now, busy=False)  # not due yet: nothing happens, nothing fails
    store.close()
    step.next_at = 0.0
    step.step(store, config, now, busy=False)  # a store that fails: logged, the tick goes on
    assert any(m.startswith("retention: ") and "trying again" in m for m in messages)


def archived_row(job_id: int, user: str, project: str | None, queue: str, end: float, wait: float = 5.0,
                 run_for: float = 100.0) -> dict:
    return {"id": job_id, "user": user, "queue": queue, "project": project, "name": "sim", "state": DONE,
            "array_id": None, "array_index": None, "submit_time": end - run_for - wait, "start_time": end - run_for,
            "end_time": end, "exit_code": 0, "exit_signal": None, "reason": None, "slots": 2, "gpus": 1,
            "hosts": [["h1", 2]], "cpu_time": 50.0, "max_rss": 1 << 20, "attempt": 1, "retries": 0,
            "command": ["./sim"]}


def test_filters_read_day_sums_of_their_own_kind_and_jobs_one_by_one_otherwise(store: JobStore) -> None:
    rows = [archived_row(i, ("alice", "bob")[i % 2], ("lab", "lab/vision", "ops", None, "laboratory")[i % 5],
                         ("normal", "gpu")[i % 3 == 0], T + i * 7200) for i in range(1, 61)]
    store.add_archived(rows)

    def sums(by: str, user: str | None = None, project: str | None = None) -> dict:
        inputs = store.accounting_inputs(by, T - DAY, T + 10 * DAY, user, project)
        return {k: (v.jobs, round(v.slot_s, 3)) for k, v in accounting.summarise(*inputs).items()}

    def expect(by: str, keep) -> dict:
        found: dict = {}
        for r in rows:
            if keep(r):
                key = r[by] or "" if by != "user" else r["user"]
                jobs, slot_s = found.get(key, (0, 0.0))
                found[key] = (jobs + 1, round(slot_s + 200.0, 3))
        return found

    under_lab = lambda r: r["project"] in ("lab", "lab/vision")  # noqa: E731 - not "laboratory"
    assert sums("project", project="lab") == expect("project", under_lab)
    assert sums("user", user="alice") == expect("user", lambda r: r["user"] == "alice")
    assert sums("queue", user="alice") == expect("queue", lambda r: r["user"] == "alice")  # one by one
    assert sums("queue", project="lab") == expect("queue", under_lab)
    assert sums("queue") == expect("queue", lambda r: True)
    assert store.accounting_inputs("queue", T - DAY, T + 10 * DAY)[1] == []  # whole days: day sums only
    assert len(store.accounting_inputs("queue", T - DAY, T + 10 * DAY, "alice")[1]) == 30  # each wait


def test_history_selects_by_project_subtree_user_and_window(store: JobStore) -> None:
    rows = [archived_row(i, ("alice", "bob")[i % 2], ("lab", "lab/vision", "laboratory", None)[i % 4], "normal",
                         T + i * 3600) for i in range(1, 13)]
    store.add_archived(rows)
    live = run(store, "alice", T + 20 * 3600, 1, 1)
    lab, more = store.history(project="lab")
    assert [j["id"] for j in lab] == [r["id"] for r in rows if r["project"] in ("lab", "lab/vision")] and not more
    window, _ = store.history(user="alice", since=T + 5 * 3600, until=T + 21 * 3600)
    assert live == 13 and [j["id"] for j in window] == [6, 8, 10, 12, live]  # ended after since, submitted before
    newest, more = store.history(user="alice", limit=2)
    assert [j["id"] for j in newest] == [12, live] and more


def test_time_in_states_walks_requeues_holds_and_suspends() -> None:
    events = [(0.0, "submitted", {"held": True}), (5.0, "released", None), (7.0, "dispatched", {}),
              (8.0, "started", {}), (18.0, "suspended", {}), (20.0, "resumed", {}),
              (30.0, "requeued", {"from": "RUN", "to": "PEND"}), (31.0, "dispatched", {}), (32.0, "started", {}),
              (40.0, "kill_requested", {}), (42.0, "finished", {"state": "EXIT"}), (50.0, "host_hooks", {})]
    assert accounting.time_in_states(events, now=100.0) == {"PSUSP": 5.0, "PEND": 3.0, "DISP": 2.0, "RUN": 30.0,
                                                            "USUSP": 2.0, "total": 42.0}
    waiting = accounting.time_in_states([(0.0, "submitted", {})], now=9.0)
    assert waiting == {"PEND": 9.0, "total": 9.0}  # not ended: up to now
