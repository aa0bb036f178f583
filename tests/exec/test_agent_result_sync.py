"""Who makes a reused supervisor's result durable (exec/agent/pool.py): the worker appends it without
a sync and goes on; the agent fdatasyncs the journal before it reports the result; a worker that
exits with no agent to do so syncs first. Real processes under strace -f: the order of the write of
the record, the fdatasyncs and the event's write, and which process made each."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.support.agent_local import WAIT_JOB, journal_result
from tests.support.raw_agent import py, supervisor_pid, unit
from tests.support.waiting import wait_until

SYNCED = re.compile(r"^(\d+) +(?:fdatasync\(.*|<\.\.\. fdatasync resumed>.*)= 0$")


def traced(agents, log: Path):
    # strace comes with the test dependencies (tests/install_test_deps.sh): its absence is a failure
    assert shutil.which("strace"), "strace is missing: run tests/install_test_deps.sh"
    return agents(prefix=("strace", "-f", "-qq", "-s", "300", "-e", "trace=write,fdatasync", "-o", str(log)))


def record_write(lines: list[str], name: str) -> tuple[int, int]:
    """(line index, pid) of the write of `name`'s `finished` record."""
    needle = '\\"event\\":\\"finished\\",\\"unit\\":\\"' + name + '\\"'
    i = next(i for i, line in enumerate(lines) if needle in line and "write(1," not in line)
    return i, int(lines[i].split()[0])


def syncs(lines: list[str], pid: int, after: int, before: int) -> int:
    """fdatasyncs that `pid` completed between lines `after` and `before`."""
    return sum(1 for line in lines[after + 1 : before] if (m := SYNCED.match(line)) and int(m.group(1)) == pid)


def test_the_agent_not_the_worker_fdatasyncs_a_reused_supervisors_result_before_it_reports_it(agents, spool, tmp_path):
    log = tmp_path / "strace.log"
    agent = traced(agents, log)
    for name, code in (("first", 7), ("second", 9)):  # the second in the worker the first ran in
        agent.launch(unit(name, py(f"raise SystemExit({code})"), tmp_path))
        assert agent.finished(name)["exit_code"] == code
    worker = supervisor_pid(spool, "second")
    assert agent.close() == 0  # strace ends with its last tracee: the log is whole
    lines = log.read_text().splitlines()
    for name in ("first", "second"):
        record, writer = record_write(lines, name)
        event = next(i for i, line in enumerate(lines) if "write(1," in line and '\\"unit\\":\\"' + name in line
                     and '\\"event\\":\\"finished\\"' in line)
        reporter = int(lines[event].split()[0])
        assert writer == worker and reporter != worker, (writer, reporter, worker)
        assert syncs(lines, reporter, record, event) >= 1, f"the agent did not sync {name}'s result before the event"
        assert syncs(lines, worker, record, event) == 0, f"the worker fdatasynced {name}'s result itself"


def test_a_worker_whose_agent_is_gone_syncs_its_result_before_it_exits(agents, spool, tmp_path):
    log, release = tmp_path / "strace.log", tmp_path / "release"
    agent = traced(agents, log)
    agent.launch(unit("orphaned", py(WAIT_JOB, str(release)), tmp_path))
    worker = supervisor_pid(spool, "orphaned")
    agent.proc.stdin.close()  # the agent exits (no lease: no orphan stays); its job runs on
    wait_until(lambda: agent.eof.is_set(), 10, "the agent to exit")
    release.touch()
    wait_until(lambda: journal_result(spool, "orphaned"), 10, "the orphaned job's result")
    assert agent.close() == 0  # strace ends once the worker has exited too
    lines = log.read_text().splitlines()
    record, writer = record_write(lines, "orphaned")
    assert writer == worker
    assert syncs(lines, worker, record, len(lines)) >= 1, "the worker exited without syncing its result"
