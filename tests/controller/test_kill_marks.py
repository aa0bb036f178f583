"""Kill delivery as a part (kill_marks.KillMarks, `Controller.kills`) in the controller in-process:
a kill stays marked while its host is out of reach, through a restart, and lands once it is back."""

from __future__ import annotations

from tests.support.inproc import InProc
from xce_lite.controller.invariants import check_invariants


def test_a_kill_stays_marked_while_its_host_is_cut_off_and_through_a_restart_then_lands():
    p = InProc(host_lost_after="600s", lease="300s")
    try:
        p.step(0.1)
        a = p.submit(runtime=300)
        for _ in range(2):
            p.step(1.0)
        first = p.job(a).hosts[0][0]
        p.drop(first)
        p.step(1.0)
        assert p.kill(a)["ok"]
        assert p.ctl.kills.get(a) is not None and p.ctl.state.active[a].killed
        for _ in range(3):
            p.step(1.0)
            check_invariants(p.ctl, {a})
        assert p.ctl.kills.get(a) is not None and a not in p.ctl.kills.inflight, "nothing sent to a host cut off"
        assert p.job(a).state == "RUN"
        p.restart()  # the next controller marks the recorded kill again
        p.step(1.0)
        assert p.ctl.kills.get(a) is not None
        p.back(first)
        for _ in range(3):
            p.step(1.0)
            check_invariants(p.ctl, {a})
        job = p.job(a)
        assert job.state == "EXIT" and job.reason.startswith("killed by"), job.reason
        assert not p.ctl.kills and not p.ctl.kills.inflight
    finally:
        p.close()
