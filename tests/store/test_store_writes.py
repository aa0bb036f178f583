"""store/jobs.py on real SQLite files: writing and reading jobs.

Guarded transitions, one event per change, CHECKs that tie columns to states, append-only events,
exact round trips of awkward text, and what a concurrent reader sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.store import T, finish, raw, running, spec
from xce_lite.models import DISP, DONE, EXIT, PEND, PSUSP, RUN, JobSpec
from xce_lite.store import db
from xce_lite.store.jobs import JobStore, Requeue

# ---- guarded writes ---------------------------------------------------------------------------


def test_submit_stores_pend_and_held_jobs(store: JobStore) -> None:
    ids = store.submit([(spec("a"), "normal"), (spec("b", hold=True), "low")], "alice", T)
    assert ids == [1, 2]
    first, second = store.jobs(ids)
    assert (first.state, first.queue, first.user, first.submit_time, first.attempt) == (PEND, "normal", "alice", T, 0)
    assert (second.state, second.queue, second.reason) == (PSUSP, "low", "held at submission")


def test_change_state_moves_only_jobs_still_in_the_from_state(store: JobStore) -> None:
    ids = store.submit([(spec(), "normal")] * 3, "alice", T)
    assert store.change_state([ids[1]], PEND, PSUSP, "held", T + 1, reason="held by alice") == [ids[1]]
    # a stale view: the caller thinks all three are PEND
    assert store.change_state(ids, PEND, PSUSP, "held", T + 2, reason="held by bob") == [ids[0], ids[2]]
    assert [j.state for j in store.jobs(ids)] == [PSUSP] * 3
    assert store.get(ids[1]).reason == "held by alice"
    assert store.change_state([ids[0], 999], PSUSP, PEND, "released", T + 3) == [ids[0]]
    assert store.get(ids[0]).reason is None
    assert store.change_state([], PEND, PSUSP, "held", T + 4) == []


def test_dispatch_moves_pend_to_disp_only(store: JobStore) -> None:
    pend, held, other = store.submit([(spec(slots=2), "normal"), (spec(hold=True), "normal"),
                                      (spec(), "normal")], "alice", T)
    store.set_pend_reasons({pend: "waiting"})
    plans = [(pend, 1, [["h1", 2]], "xce-t-1-1-0"), (held, 1, [["h1", 1]], "xce-t-2-1-0")]
    assert store.dispatch(plans, T + 1) == [pend]
    assert store.dispatch(plans, T + 2) == []  # already DISP: a repeated dispatch is refused
    job = store.get(pend)
    assert (job.state, job.attempt, job.hosts, job.unit, job.pend_reason) == (
        DISP, 1, (("h1", 2),), "xce-t-1-1-0", None)
    assert store.get(held).state == PSUSP
    assert store.get(other).state == PEND


def test_started_moves_disp_to_run_only(store: JobStore) -> None:
    disp, pend = store.submit([(spec(), "normal")] * 2, "alice", T)
    store.dispatch([(disp, 1, [["h1", 1]], "u1")], T + 1)
    assert store.started([(disp, T + 1.5), (pend, T + 1.5)], T + 2) == [disp]
    assert store.started([(disp, T + 9)], T + 9) == []
    job = store.get(disp)
    assert (job.state, job.start_time) == (RUN, T + 1.5)
    assert store.get(pend).state == PEND


def test_finish_records_the_exit_fields(store: JobStore) -> None:
    done, failed, killed = running(store, 3)
    moved = store.finish([
        finish(done),
        finish(failed, state=EXIT, exit_code=3, reason="exit code 3", cpu_time=0.5, max_rss=10),
        finish(killed, state=EXIT, exit_code=None, exit_signal=9, reason="killed by alice", start_time=T + 99),
    ], T + 10)
    assert moved == [done, failed, killed]
    a, b, c = store.jobs([done, failed, killed])
    assert (a.state, a.end_time, a.exit_code, a.exit_signal, a.cpu_time, a.max_rss, a.reason) == (
        DONE, T + 10, 0, None, 1.5, 4096, None)
    assert (b.state, b.exit_code, b.cpu_time, b.max_rss, b.reason) == (EXIT, 3, 0.5, 10, "exit code 3")
    assert (c.state, c.exit_code, c.exit_signal, c.reason) == (EXIT, None, 9, "killed by alice")
    assert c.start_time == T + 2  # the start it had is kept
    assert store.finish([finish(done)], T + 11) == []  # finished once only
    assert store.unfinished() == []
    assert [j.id for j in store.jobs()] == []
    assert [j.id for j in store.jobs(include_finished=True)] == [done, failed, killed]


def test_finish_from_disp_takes_the_start_time_given(store: JobStore) -> None:
    (job_id,) = store.submit([(spec(), "normal")], "alice", T)
    store.dispatch([(job_id, 1, [["h1", 1]], "u")], T + 1)
    assert store.finish([finish(job_id, from_state=DISP, start_time=T + 1.5)], T + 3) == [job_id]
    assert store.get(job_id).start_time == T + 1.5
    assert store.finish([finish(job_id, from_state=RUN)], T + 4) == []


def _all_events(path: Path) -> list[tuple[int, str]]:
    con = raw(path)
    try:
        return [(job_id, kind) for job_id, kind in con.execute("SELECT job_id, kind FROM events ORDER BY seq")]
    finally:
        con.close()


def test_each_write_makes_exactly_one_event_of_its_kind(store: JobStore, path: Path) -> None:
    seen: list[tuple[int, str]] = []

    def expect_new(*events: tuple[int, str]) -> None:
        seen.extend(events)
        assert _all_events(path) == seen

    a, b, c = store.submit([(spec(), "normal"), (spec(), "normal"), (spec(hold=True), "normal")], "alice", T)
    expect_new((a, "submitted"), (b, "submitted"), (c, "submitted"))
    store.change_state([c], PSUSP, PEND, "released", T)
    expect_new((c, "released"))
    store.change_state([c], PEND, PSUSP, "held", T, reason="held by alice")
    expect_new((c, "held"))
    store.dispatch([(a, 1, [["h1", 1]], "ua"), (b, 1, [["h1", 1]], "ub"), (c, 1, [["h1", 1]], "uc")], T)
    expect_new((a, "dispatched"), (b, "dispatched"))
    store.started([(a, T), (c, T)], T)
    expect_new((a, "started"))
    store.record_event(a, "kill_requested", T, {"by": "alice"})
    expect_new((a, "kill_requested"))
    store.finish([finish(a), finish(b)], T)  # b is DISP, not RUN: refused
    expect_new((a, "finished"))
    store.finish([finish(b, from_state=DISP, state=EXIT, exit_code=None)], T, event="launch_failed")
    expect_new((b, "launch_failed"))
    store.change_state([c], PSUSP, EXIT, "killed_pending", T, reason="killed", end_time=T)
    expect_new((c, "killed_pending"))
    # refused changes and bookkeeping writes make none
    store.change_state([a, b, c], PEND, PSUSP, "held", T)
    store.set_pend_reasons({a: "x"})
    store.set_meta("k", "v")
    expect_new()


def test_event_data_says_what_happened(store: JobStore) -> None:
    (job_id,) = running(store)
    store.finish([finish(job_id, state=EXIT, exit_code=2, reason="exit code 2")], T + 10)
    history = store.events(job_id)
    assert [(time, kind) for time, kind, _ in history] == [
        (T, "submitted"), (T + 1, "dispatched"), (T + 2, "started"), (T + 10, "finished")]
    assert history[0][2] == {"user": "alice", "queue": "normal", "held": False}
    assert history[1][2] == {"attempt": 1, "hosts": [["h1", 1]], "unit": f"xce-t-{job_id}-1-0"}
    assert history[3][2]["exit_code"] == 2 and history[3][2]["state"] == EXIT


# ---- the schema's own guarantees (raw SQL: what the store would never write) -------------------

INSERT = ("INSERT INTO jobs (user, queue, state, spec, slots, submit_time, hosts, unit, start_time, end_time, "
          "exit_code) VALUES ('alice', 'normal', ?, '{}', 1, 0, ?, ?, ?, ?, ?)")


@pytest.mark.parametrize(
    ("row", "check"),
    [
        pytest.param(("RUN", None, None, 1.0, None, None), "hosts IS NOT NULL", id="RUN-without-hosts-or-unit"),
        pytest.param(("RUN", '[["h1", 1]]', None, 1.0, None, None), "unit IS NOT NULL", id="RUN-without-unit"),
        pytest.param(("DISP", None, "u", None, None, None), "hosts IS NOT NULL", id="DISP-without-hosts"),
        pytest.param(("RUN", '[["h1", 1]]', "u", None, None, None), "start_time IS NOT NULL", id="RUN-never-started"),
        pytest.param(("DONE", '[["h1", 1]]', "u", 1.0, 2.0, 1), "exit_code IS 0", id="DONE-with-exit-code-1"),
        pytest.param(("DONE", '[["h1", 1]]', "u", 1.0, 2.0, None), "exit_code IS 0", id="DONE-without-exit-code"),
        pytest.param(("EXIT", None, None, None, None, None), "end_time IS NOT NULL", id="EXIT-without-end"),
        pytest.param(("ZOMBIE", None, None, None, None, None), "state = 'PEND' OR", id="unknown-state"),
        pytest.param(("pend", None, None, None, None, None), "state = 'PEND' OR", id="lower-case-state"),
    ],
)
def test_checks_refuse_rows_that_break_a_state_rule(store: JobStore, path: Path, row: tuple, check: str) -> None:
    con = raw(path)
    try:
        with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed") as caught:
            con.execute(INSERT, row)
        assert check in str(caught.value)
        assert con.execute("SELECT count(*) FROM jobs").get == 0
    finally:
        con.close()


def test_checks_let_the_same_rows_in_when_they_are_right(store: JobStore, path: Path) -> None:
    con = raw(path)
    try:
        con.execute(INSERT, ("PEND", None, None, None, None, None))
        con.execute(INSERT, ("RUN", '[["h1", 1]]', "u", 1.0, None, None))
        con.execute(INSERT, ("DONE", '[["h1", 1]]', "u", 1.0, 2.0, 0))
        con.execute(INSERT, ("EXIT", None, None, None, 2.0, None))
        assert con.execute("SELECT count(*) FROM jobs").get == 4
    finally:
        con.close()


def test_an_update_cannot_break_a_state_rule_either(store: JobStore, path: Path) -> None:
    (job_id,) = store.submit([(spec(), "normal")], "alice", T)
    con = raw(path)
    try:
        with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed"):
            con.execute("UPDATE jobs SET state = 'RUN', start_time = 1 WHERE id = ?", (job_id,))
    finally:
        con.close()
    assert store.get(job_id).state == PEND


@pytest.mark.parametrize("sql", ["UPDATE events SET kind = 'held'", "UPDATE events SET data = NULL",
                                 "DELETE FROM events", "DELETE FROM events WHERE seq = 1"])
def test_events_are_append_only(store: JobStore, path: Path, sql: str) -> None:
    (job_id,) = running(store)
    before = store.events(job_id)
    con = raw(path)
    try:
        with pytest.raises(apsw.ConstraintError, match="append-only"):
            con.execute(sql)
    finally:
        con.close()
    assert store.events(job_id) == before


def test_a_requeued_job_is_pending_again_and_holds_nothing(store: JobStore) -> None:
    a, b = running(store, count=2)
    assert store.requeue([Requeue(a, RUN, "host h1 lost"), Requeue(b, DISP, "stale view")], T + 5) == [a]
    job = store.get(a)
    assert (job.state, job.hosts, job.unit, job.alloc, job.start_time, job.attempt) == (PEND, (), None, None, None, 1)
    assert job.reason == "host h1 lost"
    assert store.events(a)[-1] == (T + 5, "requeued", {"from": RUN, "to": PEND, "reason": "host h1 lost"})
    assert store.get(b).state == RUN  # the guarded update refused the stale view
    # the next dispatch takes the next attempt, under a new unit name
    assert store.dispatch([(a, 2, [["h2", 1]], "xce-t-1-2-0")], T + 6) == [a]
    assert (store.get(a).attempt, store.get(a).unit) == (2, "xce-t-1-2-0")


def test_a_requeue_with_hold_goes_to_psusp(store: JobStore) -> None:
    (a,) = running(store)
    assert store.requeue([Requeue(a, RUN, "requeued by alice", hold=True)], T + 5) == [a]
    assert store.get(a).state == PSUSP


def test_an_event_of_an_unknown_kind_is_refused(store: JobStore, path: Path) -> None:
    (job_id,) = running(store)
    before = store.events(job_id)
    with pytest.raises(apsw.ConstraintError, match="FOREIGN KEY"):  # a bug, not an operator's problem
        store.record_event(job_id, "teleported", T)
    assert store.events(job_id) == before


def test_every_lifecycle_event_is_a_kind_the_store_accepts(store: JobStore) -> None:
    from xce_lite.lifecycle import EVENT_KINDS

    stored_as = {"submitted_held": "submitted"}  # a held submit is stored as `submitted` with held=true
    assert {stored_as.get(kind, kind) for kind in EVENT_KINDS} | {"kill_requested"} <= store.event_kinds()


# ---- round trips ------------------------------------------------------------------------------

AWKWARD = ["line1\nline2", "tab\there", "cr\r\n", "'single'", '"double"', "back\\slash", "$HOME `x` $(y)",
           "é☃漢字🙂", "\udcff", "a\udcffb\udc80", "\ud800", "", " ", "\x1b[31m", "\u2028\u2029", "%J %% {}"]


def test_awkward_argv_and_env_round_trip_exactly(store: JobStore) -> None:
    env = {f"V{i}": value for i, value in enumerate(AWKWARD)}
    env["N\udcff\u00e9"] = "name with a surrogate"
    original = spec("printf", *AWKWARD, name="n\n'\"\udcff", env=env)
    (job_id,) = store.submit([(original, "normal")], "alice", T)
    (job,) = store.jobs([job_id])
    assert job.spec == original
    assert job.spec.argv == ("printf", *AWKWARD)
    assert job.spec.env == env
    assert list(job.spec.env) == list(env)  # order kept too


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobStore]:
    s = JobStore(tmp_path_factory.mktemp("roundtrip") / "xce.db")
    yield s
    s.close()


any_text = st.text(st.characters(exclude_categories=(), exclude_characters="\0"), max_size=30)


# deadline=None: each example is a committed write, fsynced (synchronous=FULL); a busy disk is slow
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150, deadline=None)
@given(argv=st.lists(any_text, min_size=1, max_size=5).map(lambda a: ["x" + a[0], *a[1:]]),
       env=st.dictionaries(any_text.filter(lambda k: k and "=" not in k), any_text, max_size=5))
def test_any_argv_and_env_round_trip_exactly(shared_store: JobStore, argv: list[str], env: dict[str, str]) -> None:
    original = JobSpec(argv=tuple(argv), cwd="/", env=env)
    (job_id,) = shared_store.submit([(original, "normal")], "alice", T)
    assert shared_store.get(job_id).spec == original


# ---- concurrent readers -----------------------------------------------------------------------


def test_a_reader_sees_a_write_only_after_commit(store: JobStore, path: Path) -> None:
    reader = JobStore(path)  # another process's view, its read connection opened now, before the write
    try:
        assert reader.jobs() == []
        con = db.connect(path)
        try:
            with db.write(con):
                con.execute("INSERT INTO jobs (user, queue, state, spec, slots, submit_time) "
                            "VALUES ('bob', 'normal', 'PEND', ?, 1, ?)", (spec("w").to_json(), T))
                assert reader.jobs() == []
                assert reader.get(1) is None
            assert [(j.id, j.user) for j in reader.jobs()] == [(1, "bob")]

            with pytest.raises(RuntimeError), db.write(con):
                con.execute("INSERT INTO jobs (user, queue, state, spec, slots, submit_time) "
                            "VALUES ('carol', 'normal', 'PEND', ?, 1, ?)", (spec("r").to_json(), T))
                raise RuntimeError("changed my mind")
            assert [j.user for j in reader.jobs()] == ["bob"]  # rolled back: never seen
        finally:
            con.close()
    finally:
        reader.close()


def test_a_read_transaction_keeps_its_snapshot_while_the_store_commits(store: JobStore, path: Path) -> None:
    con = db.connect(path, create=False, readonly=True)
    try:
        con.execute("BEGIN")
        assert con.execute("SELECT count(*) FROM jobs").get == 0
        store.submit([(spec(), "normal")], "alice", T)
        assert store.jobs() != []
        assert con.execute("SELECT count(*) FROM jobs").get == 0
        con.execute("COMMIT")
        assert con.execute("SELECT count(*) FROM jobs").get == 1
    finally:
        con.close()
