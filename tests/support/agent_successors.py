"""Shared by the agent's queued-successor tests (tests/exec/test_agent_successor*.py): units that
hold until told, successors that count their runs in a file, and a wait for an agent's event."""

from __future__ import annotations

from pathlib import Path

from tests.support.agent_local import WAIT_JOB
from tests.support.raw_agent import RawAgent, py, unit
from tests.support.waiting import wait_until

COUNT = "import sys\nopen(sys.argv[1], 'a').write('ran\\n')\n"


def hold(name: str, tmp: Path, code: int = 0) -> dict:
    """A unit that runs until tmp/go-NAME exists, then exits `code`."""
    return unit(name, py(WAIT_JOB, str(tmp / f"go-{name}"), str(code)), tmp)


def counted(name: str, tmp: Path, after: str) -> dict:
    """A successor of `after` that counts its runs in tmp/NAME.count."""
    return unit(name, py(COUNT, str(tmp / f"{name}.count")), tmp, after=after)


def runs(tmp: Path, name: str) -> int:
    path = tmp / f"{name}.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def event(agent: RawAgent, kind: str, unit_name: str) -> dict:
    return wait_until(lambda: next((e for e in agent.events if e["event"] == kind and e["unit"] == unit_name), None),
                      20, f"the {kind} event of {unit_name}")
