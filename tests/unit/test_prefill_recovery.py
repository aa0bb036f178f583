"""The controller's side of queued successors that needs no host (issue 18, prefill): a host's
`list` of a successor still queued is adopted as it is (never launched again, never judged
vanished) when the controller expects it, and stopped when it does not; a restart finds a
successor's predecessor again in its last dispatch's event; a successor found started wakes a session."""

from __future__ import annotations

from types import SimpleNamespace

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.sched_view import Holding
from xce_lite.controller.jobunits import Expected, reconcile
from xce_lite.controller.prefill_chains import behind_in, behind_of
from xce_lite.controller.prefilling import Prefill
from xce_lite.controller.state import RUNNING, SENT, Active, ControllerState
from xce_lite.exec.host import UnitInfo
from xce_lite.models import DISP, RUN
from xce_lite.sched.prefill import queued_reason

CONFIG = {"cluster": "c", "hosts": [{"name": "h1", "slots": 1, "mem": "1G"}],
          "queues": [{"name": "normal", "default": True}]}


def test_a_listed_queued_unit_is_left_to_start_if_expected_and_stopped_if_not() -> None:
    listed = [UnitInfo("u-b", "queued"), UnitInfo("u-stale", "queued"), UnitInfo("u-drain", "queued")]
    expected = {"u-b": Expected(2, 0, started=False), "u-drain": Expected(3, -1, started=True, draining=True),
                "u-c": Expected(4, 0, started=False)}
    seen = reconcile(listed, expected)
    assert seen.to_launch == ["u-c"]  # u-b is on its host already: not launched again
    assert seen.running == [] and seen.vanished == [] and seen.finished == []
    assert sorted(seen.stale) == ["u-drain", "u-stale"]  # a stop drops them from the host's queue


def test_a_restart_reads_the_predecessor_from_the_last_dispatch_event() -> None:
    assert behind_of(queued_reason("h1", 42)) == 42
    assert behind_of("queued on node-7.lab behind job 7") == 7
    for other in (None, "", "local: slots needed 1, free 0", "queued on h1 behind job x"):
        assert behind_of(other) is None
    queued = {"attempt": 2, "hosts": [["h1", 1]], "queued": queued_reason("h1", 42)}
    plain = {"attempt": 1, "hosts": [["h1", 1]]}
    assert behind_in([(1.0, "submitted", None), (2.0, "dispatched", plain), (3.0, "requeued", {"reason": "x"}),
                      (4.0, "dispatched", queued)]) == 42
    # its pend reason is the scheduler's: only the dispatch says where it waits; a later plain
    # dispatch (withdrawn, then dispatched as any job) is no successor
    assert behind_in([(2.0, "dispatched", queued), (3.0, "requeued", None), (4.0, "dispatched", plain)]) is None
    assert behind_in([(1.0, "submitted", None)]) is None


def test_a_successor_found_started_by_its_launch_reply_makes_the_next_tick_name_its_own_successor() -> None:
    """Its predecessor ended before its launch came: the host started it at once and said so in the
    reply, after its predecessor's end (no `unqueued`, which marks the state dirty). The tick that
    finds it started clears its `after` after the session was decided; the next one must run a
    session, or a job waiting for a successor's place waits until it ends (a test saw it once)."""
    state = ControllerState(ClusterConfig.model_validate(CONFIG), {})
    prefill = Prefill(state, None, SimpleNamespace(), lambda _message: None)
    pred = Active(1, "alice", "normal", RUN, 1, Holding(()), ("u1",), [RUNNING])
    succ = Active(2, "alice", "normal", DISP, 1, Holding(()), ("u2",), [SENT], after=1)
    state.active[1], state.active[2], state.behind[2] = pred, succ, 1
    assert prefill.hidden(set()) == {2} and succ.queued  # it holds nothing beside its predecessor
    assert prefill.hidden({1}) == set() and not succ.queued  # its predecessor ends: it holds its own
    state.dirty = False
    succ.status[0] = RUNNING  # the launch reply: started
    # job 1's end not known here yet: job 2 holds nothing beside it still (started_early), but runs
    assert prefill.hidden(set()) == {2} and prefill.started_early == {2: 1}
    assert succ.after is None and 2 not in state.behind
    assert state.dirty and state.wake.is_set()
