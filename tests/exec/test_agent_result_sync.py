"""Who makes a reused supervisor's result durable (exec/agent/pool.py): the worker appends it without
a sync and goes on; the agent fdatasyncs the journal before it reports the result; a worker that
exits with no agent to do so syncs first; a new agent syncs what dead ones left before it reports
it. Real processes under strace -f: the order of the write of the record, the fdatasyncs and the
event's write, and which process made each."""

from __future__ import annotations

import os
import signal

from tests.support.agent_local import WAIT_JOB, journal_result
from tests.support.procs import proc_field
from tests.support.raw_agent import py, supervisor_pid, unit
from tests.support.strace_log import record_write, syncs, traced
from tests.support.waiting import wait_until

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


def test_a_result_a_killed_worker_left_unsynced_under_a_frozen_then_killed_agent_is_synced_by_the_next(
        agents, spool, tmp_path):
    """Faults in a row: the agent freezes, the job ends (its worker appends the result, unsynced, and
    says "d" into a socket nobody reads), the worker is killed before anything synced it, then the
    agent. The next agent syncs the journal before it reports that result, and never runs the job again."""
    counter, release = tmp_path / "count", tmp_path / "release"
    first = agents()
    job = unit("frozen", py(f"open({str(counter)!r}, 'a').write('ran\\n')\n" + WAIT_JOB, str(release), "6"), tmp_path)
    first.launch(job)
    worker = supervisor_pid(spool, "frozen")
    os.kill(first.proc.pid, signal.SIGSTOP)
    release.touch()
    wait_until(lambda: journal_result(spool, "frozen"), 10, "the worker to record the result")
    os.kill(worker, signal.SIGKILL)  # blocked on the frozen agent's "r": it never syncs
    wait_until(lambda: proc_field(worker, 0) in (None, "Z"), 5, "the worker to die")
    first.proc.kill()
    first.close()

    log = tmp_path / "strace.log"
    second = traced(agents, log)
    [listed] = second.request("list")["units"]
    assert listed["status"] == "finished" and listed["result"]["exit_code"] == 6
    again = second.launch(job)[0]
    assert again["status"] == "finished" and again["result"]["exit_code"] == 6
    assert second.close() == 0
    assert counter.read_text() == "ran\n"  # the job ran once
    lines = log.read_text().splitlines()
    reply = next(i for i, line in enumerate(lines) if "write(1," in line and '\\"frozen\\"' in line)
    agent = int(lines[reply].split()[0])
    assert syncs(lines, agent, -1, reply) >= 1, "the next agent reported the result before it synced it"
