"""Agents under strace -f, and what their logs say: which process wrote a unit's `finished` record,
and how many fdatasyncs a process completed between two lines (tests/exec/test_agent_result_*.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

SYNCED = re.compile(r"^(\d+) +(?:fdatasync\(.*|<\.\.\. fdatasync resumed>.*)= 0$")


def traced(agents, log: Path, size: int = 300):
    # strace comes with the test dependencies (tests/install_test_deps.sh): its absence is a failure
    assert shutil.which("strace"), "strace is missing: run tests/install_test_deps.sh"
    return agents(prefix=("strace", "-f", "-qq", "-s", str(size), "-e", "trace=write,fdatasync", "-o", str(log)))


def finished_text(name: str) -> str:
    """How `name`'s `finished` record or event reads in a write strace logged (quotes escaped)."""
    return '\\"event\\":\\"finished\\",\\"unit\\":\\"' + name + '\\"'


def record_write(lines: list[str], name: str) -> tuple[int, int]:
    """(line index, pid) of the write of `name`'s `finished` record (to the journal, not stdout)."""
    needle = finished_text(name)
    i = next(i for i, line in enumerate(lines) if needle in line and "write(1," not in line)
    return i, int(lines[i].split()[0])


def syncs(lines: list[str], pid: int, after: int, before: int) -> int:
    """fdatasyncs that `pid` completed between lines `after` and `before`."""
    return sum(1 for line in lines[after + 1 : before] if (m := SYNCED.match(line)) and int(m.group(1)) == pid)
