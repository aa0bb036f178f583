"""The controller's side of queued successors that needs no host (issue 18, prefill): a host's
`list` of a successor still queued is adopted as it is (never launched again, never judged
vanished) when the controller expects it, and stopped when it does not; a restart finds a
successor's predecessor again in its stored reason."""

from __future__ import annotations

from xce_lite.controller.jobunits import Expected, reconcile
from xce_lite.controller.prefilling import behind_of
from xce_lite.exec.host import UnitInfo
from xce_lite.sched.prefill import queued_reason


def test_a_listed_queued_unit_is_left_to_start_if_expected_and_stopped_if_not() -> None:
    listed = [UnitInfo("u-b", "queued"), UnitInfo("u-stale", "queued"), UnitInfo("u-drain", "queued")]
    expected = {"u-b": Expected(2, 0, started=False), "u-drain": Expected(3, -1, started=True, draining=True),
                "u-c": Expected(4, 0, started=False)}
    seen = reconcile(listed, expected)
    assert seen.to_launch == ["u-c"]  # u-b is on its host already: not launched again
    assert seen.running == [] and seen.vanished == [] and seen.finished == []
    assert sorted(seen.stale) == ["u-drain", "u-stale"]  # a stop drops them from the host's queue


def test_a_restart_reads_the_predecessor_from_the_stored_reason() -> None:
    assert behind_of(queued_reason("h1", 42)) == 42
    assert behind_of("queued on node-7.lab behind job 7") == 7
    for other in (None, "", "local: slots needed 1, free 0", "queued on h1 behind job x"):
        assert behind_of(other) is None
