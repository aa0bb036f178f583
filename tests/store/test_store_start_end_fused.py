"""A job whose start and end one tick's commit records is moved by one UPDATE, DISP -> its end,
instead of two (store/transitions.started_and_finished; issue 18): rows and events end exactly as
the two statements leave them, the same guards refuse what they refused (a row not DISP: its start
refused, its end taken from RUN as before), and the other jobs of the commit are as before."""

from __future__ import annotations

from pathlib import Path

from tests.support.store import T, finish, spec
from xce_lite.models import EXIT
from xce_lite.store import transitions
from xce_lite.store.jobs import JobStore, Plan, TickWrites


def _setup(path: Path) -> tuple[JobStore, list[int]]:
    """Seven jobs, dispatched; c and d started (RUN), e killed (EXIT)."""
    store = JobStore(path)
    ids = store.submit([(spec(), "normal")] * 7, "alice", T)
    store.record_tick(TickWrites(T + 1, plans=[Plan(i, 1, [["h1", 1]], f"xce-t-{i}-1-0") for i in ids]))
    c, d, e = ids[2:5]
    store.record_tick(TickWrites(T + 2, started=[(c, T + 1.5), (d, T + 1.6)]))
    store.record_tick(TickWrites(T + 3, finishes=[(finish(e, from_state="DISP", state=EXIT, reason="killed"),
                                                   "finished")]))
    return store, ids


def _tick(ids: list[int]) -> TickWrites:
    a, b, c, d, e, f, g = ids
    return TickWrites(
        T + 5,
        finishes=[(finish(a, start_time=T + 4.0, end_time=T + 4.5), "finished"),
                  (finish(c, start_time=T + 1.5, end_time=T + 4.6, exit_code=3, state=EXIT), "finished"),
                  (finish(d, start_time=T + 1.6, end_time=T + 4.7), "finished"),  # its start came before
                  (finish(e, end_time=T + 4.8), "finished"),  # EXIT already: refused
                  (finish(f, from_state="DISP", state=EXIT, reason="launch refused"), "launch_failed"),
                  (finish(g, start_time=None, end_time=T + 4.9), "finished")],
        started=[(b, T + 4.1), (a, T + 4.05), (d, T + 4.2), (e, T + 4.3), (g, T + 4.4)])


def _state(store: JobStore, ids: list[int]) -> tuple[list, list]:
    rows = [(j.id, j.state, j.start_time, j.end_time, j.exit_code, j.reason, j.pend_reason)
            for j in store.jobs(ids)]
    events = store._con.execute(
        f"SELECT job_id, time, kind, data FROM events WHERE job_id IN ({','.join('?' * len(ids))}) ORDER BY seq",
        ids).fetchall()
    return rows, events


def _updates(store: JobStore) -> list[str]:
    """The UPDATE statements of `store`'s writer from now on, one per row of an executemany."""
    seen: list[str] = []

    def trace(_cursor, sql: str, _bindings) -> bool:
        if sql.startswith("UPDATE jobs"):
            seen.append(sql)
        return True

    store._con.exec_trace = trace
    return seen


def test_a_start_and_end_in_one_commit_end_as_the_two_statements_leave_them(tmp_path: Path) -> None:
    fused, ids = _setup(tmp_path / "fused.db")
    two, same_ids = _setup(tmp_path / "two.db")
    assert ids == same_ids
    a, b, c, d, _e, f, g = ids
    w = _tick(ids)
    record = fused.record_tick(w)
    with two._write() as con:  # the two statements, as the commit made them before
        assert transitions.started(con, w.started, w.now) == [b, a, g]
        assert transitions.finish(con, w.finishes, w.now) == [a, c, d, f, g]
    assert (record.started, record.finished) == ((b, a, g), (a, c, d, f, g))
    assert _state(fused, ids) == _state(two, ids)  # rows, and events in the same order
    fused.close()
    two.close()


def test_jobs_started_and_ended_in_one_commit_take_one_update_each(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "xce.db")
    ids = store.submit([(spec(), "normal")] * 4, "alice", T)
    store.record_tick(TickWrites(T + 1, plans=[Plan(i, 1, [["h1", 1]], f"xce-t-{i}-1-0") for i in ids]))
    updates = _updates(store)
    record = store.record_tick(TickWrites(T + 2, finishes=[(finish(i, end_time=T + 2), "finished") for i in ids[:3]],
                                          started=[(i, T + 1.5) for i in ids]))
    store._con.exec_trace = None
    assert record.started == tuple(ids) and record.finished == tuple(ids[:3])
    assert len(updates) == 4  # 3 moved DISP -> DONE at once, 1 DISP -> RUN (it was 7)
    assert [(j.state, j.start_time, j.end_time, j.pend_reason) for j in store.jobs(ids)] == \
        [("DONE", T + 1.5, T + 2, None)] * 3 + [("RUN", T + 1.5, None, None)]
    kinds = store._con.execute("SELECT job_id, kind FROM events WHERE kind IN ('started', 'finished') "
                               "ORDER BY seq").fetchall()
    assert kinds == [(i, "started") for i in ids] + [(i, "finished") for i in ids[:3]]
    store.close()
