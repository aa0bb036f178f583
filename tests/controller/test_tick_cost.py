"""The tick's cost per job (issue 15's simulator goal, issue 18's CPU per job), as counts that do not
depend on the machine: the tick's commit runs one statement per kind of change whatever the number
of jobs, with the same rows moved and the same events as one row at a time; a dispatch merges a
spec once per (spec, queue) under one configuration, across sessions; submits alike are parsed and
merged once per configuration, what reads the file system checked at each; and a reconfig is never
hidden by what was merged before it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.inproc import InProc
from xce_lite.controller import dispatching
from xce_lite.controller.invariants import check_invariants
from xce_lite.errors import SpecError
from xce_lite.exec.fake import sim_argv
from xce_lite.models import JobSpec
from xce_lite.store.jobs import Finish, JobStore, Plan, TickWrites

APPS = """\
    applications:
      tool:
        env: {TOOL_HOME: /opt/tool}
    """


class Counted:
    """The store's real writer connection, counting the statements handed to SQLite from Python
    (an `execute` or an `executemany`, whatever the number of its rows)."""

    def __init__(self, con) -> None:
        self.con, self.calls = con, 0

    def execute(self, *args, **kw):
        self.calls += 1
        return self.con.execute(*args, **kw)

    def executemany(self, *args, **kw):
        self.calls += 1
        return self.con.executemany(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_a_ticks_commit_runs_one_statement_per_kind_with_the_events_of_each_row(tmp_path: Path):
    store = JobStore(tmp_path / "xce.db")
    try:
        spec = JobSpec(argv=("true",), cwd="/tmp")
        ids = store.submit([(spec, "normal")] * 40, "u1", 1.0)
        store.record_tick(TickWrites(2.0, plans=[Plan(ids[0], 1, [["h1", 1]], "u-1", None, None)]))
        counted = store._con = Counted(store._con)
        plans = [Plan(i, 1, [["h1", 1]], f"u-{i}", {"allocs": [["h1", 1, {"slots": 1}, []]], "shared": {}},
                      {"app": None, "profile_hash": ""}) for i in ids]  # the first is DISP already: refused
        # starts come first in a commit: those of jobs it dispatches are refused (they are PEND)
        record = store.record_tick(TickWrites(3.0, plans=plans, started=[(i, 2.5) for i in ids[:20]],
                                              finishes=[(Finish(ids[0], "RUN", "DONE", 2.5, 3.0, 0, None, None, None,
                                                                None), "finished")]))
        store._con = counted.con
        assert record.started == (ids[0],) and record.finished == (ids[0],)
        assert record.dispatched == tuple(ids[1:])  # the first was not PEND: refused, no event
        assert counted.calls <= 12  # BEGIN, COMMIT and one or two per kind, not one per job (40 jobs: 105 before)
        kinds = [kind for _t, kind, _d in store.events(ids[0])]
        assert kinds[-3:] == ["dispatched", "started", "finished"] and kinds.count("dispatched") == 1
        assert [kind for _t, kind, _d in store.events(ids[5])][-2:] == ["submitted", "dispatched"]
        _t, _kind, data = store.events(ids[7])[-1]
        assert data == {"attempt": 1, "hosts": [["h1", 1]], "unit": f"u-{ids[7]}", "app": None, "profile_hash": ""}
        row = store.get(ids[7])
        assert (row.state, row.unit, row.alloc["allocs"], row.effective) == (
            "DISP", f"u-{ids[7]}", [["h1", 1, {"slots": 1}, []]], {"app": None, "profile_hash": ""})
        # the events of one commit in the order of its rows, as one at a time wrote them
        order = [job_id for (job_id,) in store._reader().execute(
            "SELECT job_id FROM events WHERE kind = 'dispatched' AND time = 3.0 ORDER BY seq")]
        assert order == ids[1:]
    finally:
        store.close()


def test_a_dispatch_merges_a_spec_once_per_configuration_across_sessions(monkeypatch):
    merges = []
    real = dispatching.effective

    def counted(*args, **kw):
        merges.append(args[1])
        return real(*args, **kw)

    monkeypatch.setattr(dispatching, "effective", counted)  # the real merge, counted
    p = InProc(hosts=("h1", "h2"), slots=2, applications=APPS)
    try:
        p.step(0.1)
        ids = [p.submit(runtime=5, app="tool") for _ in range(6)]  # one request each: six submits alike
        for _ in range(12):  # 4 dispatched, then the other 2 as slots free
            p.step(1.0)
            check_invariants(p.ctl)
        assert {p.job(i).state for i in ids} == {"DONE"}
        assert len(merges) == 1  # six dispatches in two sessions: one merge (six before)
    finally:
        p.close()


def test_a_reconfig_is_never_hidden_by_a_merge_made_before_it():
    p = InProc(hosts=("h1",), slots=1, applications=APPS)
    try:
        p.step(0.1)
        first = p.submit(runtime=2, app="tool")
        for _ in range(4):
            p.step(1.0)
        assert p.job(first).state == "DONE"
        apps = p.root / "applications.yaml"
        apps.write_text(apps.read_text().replace("/opt/tool", "/opt/tool2"))
        p.ctl.config_api.reconfigure()
        second = p.submit(runtime=2, app="tool")  # the same spec: the store hands back the same JobSpec
        third = p.submit(runtime=2, app="tool")
        for _ in range(8):
            p.step(1.0)
            check_invariants(p.ctl)
        assert p.job(second).state == p.job(third).state == "DONE"
        assert p.job(first).effective["profile_env"] == {"TOOL_HOME": "/opt/tool"}
        assert p.job(second).effective["profile_env"] == p.job(third).effective["profile_env"] == {
            "TOOL_HOME": "/opt/tool2"}
        assert p.job(second).effective["profile_hash"] != p.job(first).effective["profile_hash"]
    finally:
        p.close()


def test_submits_alike_are_admitted_once_per_configuration_and_checked_each_time(monkeypatch):
    from xce_lite.controller.handlers import submit

    admits = []
    real = submit.admit

    def counted(*args, **kw):
        admits.append(args[0].app)
        return real(*args, **kw)

    monkeypatch.setattr(submit, "admit", counted)  # the real check, counted
    p = InProc(hosts=("h1",), slots=1, applications=APPS)
    try:
        p.step(0.1)
        ids = [p.submit(runtime=1, app="tool") for _ in range(3)]  # three requests of one raw spec
        assert len(admits) == 1
        missing = p.work / "gone"
        for _ in range(2):  # what reads the file system is checked at every submit
            with pytest.raises(SpecError, match="does not exist"):
                p.submit_spec(JobSpec(argv=sim_argv(1, 0), cwd=str(missing), app="tool"))
        missing.mkdir()
        ids.append(p.submit_spec(JobSpec(argv=sim_argv(1, 0), cwd=str(missing), app="tool")))
        p.step(1.0)  # the first is dispatched with the profile as it is now
        apps = p.root / "applications.yaml"
        apps.write_text(apps.read_text().replace("/opt/tool", "/opt/tool2"))
        p.ctl.config_api.reconfigure()
        ids.append(p.submit(runtime=1, app="tool"))  # admitted anew under the new profiles
        assert len(admits) == 3
        for _ in range(20):
            p.step(1.0)
            check_invariants(p.ctl)
        assert {p.job(i).state for i in ids} == {"DONE"}
        assert p.job(ids[-1]).effective["profile_env"] == {"TOOL_HOME": "/opt/tool2"}
        assert p.job(ids[0]).effective["profile_env"] == {"TOOL_HOME": "/opt/tool"}
    finally:
        p.close()
