"""A job's task counts on the wire (`min_slots`, `max_slots`, `slots`) are read from its stored
effective values, with no Effective built per job (a wait's reply of 1,000 jobs built 1,000); the
same counts as the Effective's, and the long form (`with_effective`) still builds it."""

from __future__ import annotations

from tests.support.inproc import InProc
from xce_lite.config.merge_values import Effective


def test_the_task_counts_of_dispatched_jobs_come_from_their_stored_values(monkeypatch):
    p = InProc(hosts=("h1",), slots=4)
    try:
        p.step(0.1)
        ids = [p.submit(runtime=1.0), p.submit(runtime=30.0, slots=2), p.submit(runtime=30.0)]
        for _ in range(3):
            p.step(1.0)
        jobs = p.ctl.store.jobs(ids)
        assert [j.state for j in jobs] == ["DONE", "RUN", "RUN"] and all(j.effective for j in jobs)
        built = []
        real = Effective.from_json.__func__  # type: ignore[attr-defined]
        monkeypatch.setattr(Effective, "from_json", classmethod(lambda cls, d: built.append(d) or real(cls, d)))
        wired = p.ctl.views.to_wire(jobs)
        assert built == []
        for j, w in zip(jobs, wired):
            eff = real(Effective, j.effective)
            assert (w["min_slots"], w["max_slots"]) == (eff.min_tasks, eff.max_tasks)
        assert wired[1]["min_slots"] == 2
        long = p.ctl.views.to_wire(jobs, with_effective=True)
        assert len(built) == 3 and [w["min_slots"] for w in long] == [w["min_slots"] for w in wired]
    finally:
        p.close()
