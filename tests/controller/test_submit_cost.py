"""The one-POST submit path's cost as counts that do not depend on the machine (issue 18): a new
submission with a request id reads nothing outside its one write transaction, a repeat is still
answered with what the first one stored (also once its spec no longer passes), and a kept-alive
connection's caller is identified (group database, /proc) once, not at every request, and a
one-job submit into a backlog does not walk the pending set. The real
controller runs in-process (tests/support/inproc.py) on a real SQLite store, through its real
route table (permissions and all)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.inproc import InProc
from xce_lite.api.caller import Caller
from xce_lite.controller import accept, projects, shared
from xce_lite.controller.pending_set import PendingSet
from xce_lite.errors import SpecError
from xce_lite.models import JobSpec
from xce_lite.sched.core import PendingJob
from xce_lite.sched.placement import JobRequest
from xce_lite.sim.controlled import _me


class Counted:
    """A real store connection, counting the statements handed to it."""

    def __init__(self, con) -> None:
        self.con, self.calls = con, 0

    def execute(self, *args, **kw):
        self.calls += 1
        return self.con.execute(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.con, name)


def _post(p: InProc, caller: Caller, body: dict) -> dict:
    return p.ctl.routes()[("POST", "/jobs")](caller, {}, body)


def test_a_new_request_id_is_looked_up_only_in_the_write_and_a_repeat_still_finds_its_jobs():
    p = InProc(hosts=("h1",), slots=1)
    try:
        store = p.ctl.store
        counted = store._local.con = Counted(store._reader())  # this thread's read connection
        caller = p.caller()
        work = p.work / "gone-later"
        work.mkdir()
        spec = {"argv": ["true"], "cwd": str(work), "hold": True}
        first = _post(p, caller, {"jobs": [spec], "request_id": "req-00000001"})
        assert counted.calls == 0  # no read of its own: submit_once looked the id up in its write
        again = _post(p, caller, {"jobs": [spec], "request_id": "req-00000001"})
        assert again["ids"] == first["ids"] and again["repeated"] is True
        shutil.rmtree(work)  # the spec no longer passes: a repeat is answered all the same
        late = _post(p, caller, {"jobs": [spec], "request_id": "req-00000001"})
        assert late["ids"] == first["ids"] and late["repeated"] is True
        assert [j.id for j in store.jobs(first["ids"])] == first["ids"]
        assert store.request_count() == 1 and len(store.unfinished()) == 1  # stored once
        with pytest.raises(SpecError, match="does not exist"):  # a new one is refused as before
            _post(p, caller, {"jobs": [spec], "request_id": "req-00000002"})
    finally:
        p.close()


def test_a_kept_alive_connections_caller_is_identified_once(monkeypatch):
    reads: list[str] = []
    real_groups, real_names = projects.caller_groups, shared._group_names

    def groups(caller):
        reads.append("proc")
        return real_groups(caller)

    def names(caller):
        reads.append("grp")
        return real_names(caller)

    monkeypatch.setattr(projects, "caller_groups", groups)  # the real reads, counted
    monkeypatch.setattr(shared, "_group_names", names)
    p = InProc(hosts=("h1",), slots=1)
    try:
        spec = {"argv": ["true"], "cwd": str(p.work), "hold": True}
        connection = p.caller()  # the API makes one Caller per connection (caller.py)
        for _ in range(5):
            _post(p, connection, {"jobs": [spec]})
        assert sorted(reads) == ["grp", "proc"]
        other = Caller(uid=connection.uid, pid=connection.pid, user=_me())  # another connection, same values
        _post(p, other, {"jobs": [spec]})
        assert sorted(reads) == ["grp", "grp", "proc", "proc"]  # never taken for the earlier one
        assert len(p.ctl.store.unfinished()) == 6
    finally:
        p.close()


class _Walked(dict):
    """A dict that counts the walks over it (iter), as the pending set's own store of jobs."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def test_a_one_job_submit_into_a_backlog_does_not_walk_the_pending_set():
    """Observed: PendingSet.add_all tested a submission's ids against the dict of every pending
    job (isdisjoint walks a plain dict whole) and re-sorted every submit time: a pass over the
    backlog per POST (10,000 pending: ~0.4 ms). The set stays exact: same jobs, times in order."""
    template = PendingJob(1, "u", "normal", JobRequest(1), 0, 1.0)
    pending = PendingSet()
    pending.add_all(accept._clones(template, range(1, 2001), 5.0))
    pending._jobs = _Walked(pending._jobs)
    _Walked.walks = 0
    for job_id, time in ((2001, 6.0), (2002, 4.0), (2003, 6.0)):
        pending.add_all(accept._clones(template, [job_id], time))
    assert _Walked.walks == 0
    assert len(pending) == 2003 and pending._times == sorted(pending._times)
    assert pending._times[0] == 4.0 and pending._times[-2:] == [6.0, 6.0]
    pending.add_all(accept._clones(template, [7], 9.0))  # a replaced job: one at a time, still exact
    assert len(pending) == 2003 and pending._times.count(5.0) == 1999 and pending._times[-1] == 9.0


def test_submits_alike_one_post_each_are_merged_and_encoded_once_per_configuration(monkeypatch):
    """Specs submitted alike get one JobSpec object (the admit memo, then the project resolved
    once): the pending set's merge is made once and the spec's JSON encoded once across requests,
    and made anew after a reconfig; every job is stored and pending as submitted alone."""
    encoded = []
    real_json = JobSpec.to_json

    def to_json(spec):
        encoded.append(spec.argv)
        return real_json(spec)

    monkeypatch.setattr(JobSpec, "to_json", to_json)  # the real encoding, counted
    p = InProc(hosts=("h1",), slots=1)
    try:
        merges = []
        real_pending_of = p.ctl.gating.pending_of

        def pending_of(*args):
            merges.append(args[0])
            return real_pending_of(*args)

        monkeypatch.setattr(p.ctl.gating, "pending_of", pending_of)
        spec = {"argv": ["sleep", "9"], "cwd": str(p.work)}
        ids = [_post(p, p.caller(), {"jobs": [spec], "request_id": f"alike-{i:04d}"})["ids"][0] for i in range(5)]
        assert len(merges) == 1
        assert len(encoded) == 2  # once as the admit reads the wire form (models.py), once for the store
        with p.ctl.state.mu:
            assert [p.ctl.state.pending.get(i).id for i in ids] == ids
            assert len({p.ctl.state.pending.get(i).request.id for i in ids}) == 5
        rows = p.ctl.store.jobs(ids)
        assert all(r.spec == rows[0].spec for r in rows) and rows[0].spec.project == "default"
        p.ctl.config_api.reconfigure()  # a new configuration: merged anew
        _post(p, p.caller(), {"jobs": [spec]})
        assert len(merges) == 2
    finally:
        p.close()


def test_in_shared_mode_submits_alike_are_stamped_once_and_each_checked(monkeypatch):
    """Shared mode stamps each spec with its submitter (run_as): the stamped spec of the last
    caller is handed back for the same spec and the same identity, so the memos above hold there
    too; the queue's ACL and the user's name are still checked at every request, and another
    identity gets its own stamp."""
    looked_up = []
    real_getpwnam = shared.pwd.getpwnam

    def getpwnam(name):
        looked_up.append(name)
        return real_getpwnam(name)

    monkeypatch.setattr(shared.pwd, "getpwnam", getpwnam)  # the real lookup, counted
    p = InProc(hosts=("h1",), slots=1, extra="mode: shared\n")
    try:
        me = Caller(uid=os.getuid(), pid=os.getpid(), user=_me(), gid=os.getgid(), groups=tuple(os.getgroups()))
        raw = {"argv": ["true"], "cwd": str(p.work)}
        specs = [p.ctl.submitting.validate(dict(raw), me)[0] for _ in range(3)]
        assert specs[0] is specs[1] is specs[2] and specs[0].exdata["run_as"]["uid"] == os.getuid()
        assert len(looked_up) == 3  # checked each time
        other = Caller(uid=me.uid, pid=me.pid, user=me.user, gid=me.gid, groups=(*me.groups, 4242))
        stamped = p.ctl.submitting.validate(dict(raw), other)[0]
        assert stamped is not specs[0] and stamped.exdata["run_as"]["groups"][-1] == 4242
    finally:
        p.close()


def test_an_output_directory_that_is_the_working_directory_is_looked_up_once(monkeypatch):
    p = InProc(hosts=("h1",), slots=1)
    try:
        caller = p.caller()
        looked: list[str] = []
        real = os.path.isdir

        def isdir(path):
            looked.append(str(path))
            return real(path)

        monkeypatch.setattr(os.path, "isdir", isdir)
        work, logs = str(p.work), p.work / "logs"
        logs.mkdir()
        both = {"argv": ["true"], "cwd": work, "stdout": f"{work}/o-%J", "stderr": f"{work}/e-%J", "hold": True}
        _post(p, caller, {"jobs": [both]})
        assert looked == [work]  # -o and -e go where the job runs: that directory was found just now
        looked.clear()
        _post(p, caller, {"jobs": [dict(both, stdout=f"{logs}/o-%J", stderr=f"{logs}/e-%J")]})
        assert looked == [work, str(logs)]  # another directory: looked up, once for both
        for option, field in (("-o", "stdout"), ("-e", "stderr")):  # a missing one is refused as before
            with pytest.raises(SpecError, match=f"^{option} {work}/gone/x: its directory does not exist"):
                _post(p, caller, {"jobs": [dict(both, **{field: f"{work}/gone/x"})]})
        assert len(p.ctl.store.unfinished()) == 2
    finally:
        p.close()
