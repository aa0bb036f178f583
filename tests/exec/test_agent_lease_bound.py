"""When an agent may tell the controller that a grant binds every unit of its host (`bound` in the
lease reply, exec/agent/lease.py): only once the grant is written to SPOOL/lease, and only if every
unit that may still run obeys it soon (a direct unit: the agent itself; a supervised one: a
supervisor that re-reads the file, which the agent that launched it recorded as `reread`).

The real HostLease on a real spool, with the journal's fold as an agent keeps it.
"""

from __future__ import annotations

from pathlib import Path

from xce_lite.exec.agent.journal import Unit, fold
from xce_lite.exec.agent.lease import LEASE_REREAD, HostLease, clock, read_lease
from xce_lite.exec.agent.shared import AgentState


def grant(s: AgentState, seconds: float, late: float = 0.0) -> dict:
    return HostLease(s).op_lease({"until": clock() - late + seconds, "seconds": seconds, "boot": s.boot})


def state(tmp_path: Path, journal: bytes) -> AgentState:
    s = AgentState(str(tmp_path), "h")
    fold(s.units, journal, 0)
    return s


def test_a_grant_binds_when_every_running_unit_obeys_the_lease_file_within_the_reread(tmp_path):
    s = state(tmp_path, b'{"event":"launched","unit":"new","start_time":1.0,"reread":1.0}\n'
                        b'{"event":"launched","unit":"direct","start_time":1.0,"mode":"systemd",'
                        b'"direct":{"stdout":"o","stderr":"e","grace":1}}\n')
    reply = grant(s, 30)
    assert reply["bound"] == LEASE_REREAD and read_lease(str(tmp_path), s.boot)[0] == reply["until"]


def test_a_unit_an_older_agent_launched_keeps_the_controller_reckoning_with_the_longer_lease(tmp_path):
    """Its supervisor (older code, still running) reads the lease only when the one it read ends:
    an hour, after a planned stop. Once it has ended, it no longer holds the grant back."""
    s = state(tmp_path, b'{"event":"launched","unit":"old","start_time":1.0}\n'
                        b'{"event":"launched","unit":"new","start_time":1.0,"reread":1.0}\n')
    assert s.units["old"].reread is None and grant(s, 30)["bound"] is None
    fold(s.units, b'{"event":"finished","unit":"old","result":{"exit_code":0}}\n', 0)
    assert grant(s, 30)["bound"] == LEASE_REREAD


def test_a_grant_that_came_too_late_is_not_written_and_binds_nothing(tmp_path):
    s = AgentState(str(tmp_path), "h")
    first = grant(s, 30)
    late = grant(s, 5, late=10)  # its `until` had passed when it came: the first one holds
    assert late["bound"] is None and late["until"] == first["until"]
    assert read_lease(str(tmp_path), s.boot)[0] == first["until"]


def test_the_reread_mark_survives_compaction(tmp_path):
    """A compacted journal (live_records) keeps each unit's mark, or the next agent would hold back
    every grant for units that do obey it (safe, but the hour would count again)."""
    from xce_lite.exec.agent.link import ManagerLink
    from xce_lite.exec.agent.state import UnitState

    s = state(tmp_path, b'{"event":"launched","unit":"new","start_time":1.0,"reread":1.0}\n'
                        b'{"event":"launched","unit":"old","start_time":1.0}\n')
    units: dict[str, Unit] = {}
    fold(units, UnitState(s, ManagerLink(s)).live_records(), 0)
    assert (units["new"].reread, units["old"].reread) == (1.0, None)
