"""The agent on this machine, seen from outside: its one-file bundle, a job that waits for a release
file, and the spool's journal read without the agent's own reader (so a test cannot agree with a
bug), with what it tells: results, and the pids to kill when a failed test leaves jobs behind.

Jobs that must stay running wait for a "release" file (and give up by themselves after a minute),
so nothing outlives a failed test.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
from pathlib import Path

from tests.support.procs import proc_field
from tests.support.waiting import wait_until
from xce_lite.exec import bundle
from xce_lite.exec.host import UnitFinished
from xce_lite.exec.local import LocalHost

# The one file hosts get, built from xce_lite/exec/agent/; under the source tree, which the test hosts
# can read too (their users get a copy, copy_in).
AGENT = bundle.local_file()

PY = sys.executable

WAIT_JOB = (
    "import os, sys, time\n"
    "end = time.time() + 60\n"
    "while not os.path.exists(sys.argv[1]) and time.time() < end:\n"
    "    time.sleep(0.02)\n"
    "sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)\n"
)


def journal(spool: Path) -> dict[str, dict]:
    """SPOOL/journal folded per unit, read here without agent.py's code: for each unit from its
    `launched` record to its `forgotten` one, its start time, its `started` fields and its first
    result. Unreadable lines (a torn record, one being written) are skipped."""
    units: dict[str, dict] = {}
    try:
        data = (spool / "journal").read_bytes()
    except FileNotFoundError:
        return units
    for line in data.split(b"\n"):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        event = rec.get("event")
        if event == "launched":
            fields = {"pid": None, "job": None, "kill": None, "result": None}
            units[rec["unit"]] = {"start_time": rec["start_time"], **fields}
        elif event == "forgotten":
            for name in rec["units"]:
                units.pop(name, None)
        elif rec.get("unit") in units:
            unit = units[rec["unit"]]
            if event == "started":
                unit.update(pid=rec["pid"], starttime=rec["starttime"], boot=rec["boot"], job=rec["job"])
            elif event == "kill_requested":
                unit["kill"] = rec["reason"]
            elif event == "finished" and unit["result"] is None:
                unit["result"] = rec["result"]
    return units


def journal_result(spool: Path, unit: str) -> dict | None:
    """The unit's result as the journal holds it, or None."""
    return journal(spool).get(unit, {}).get("result")


def recorded_result(spool: Path, unit: str) -> dict | None:
    """The unit's result: in the journal, or, for a direct systemd unit that ended while no agent ran,
    in the record its stop script left in its host directory (systemd.STOP_RECORD), which the next
    agent appends to the journal before it reports it."""
    from xce_lite.exec.agent.systemd import stop_record

    return journal_result(spool, unit) or stop_record(str(spool / "units" / unit), unit)


def kill_leftovers(spool: Path) -> None:
    """Kill any job and supervisor still running from `spool` (pids checked against /proc)."""
    for unit in journal(spool).values():
        supervisor, job = unit["pid"], unit["job"]
        if supervisor is None:
            continue
        if job is not None and proc_field(job, 3) == str(supervisor):  # the job's session
            os.killpg(job, signal.SIGKILL)
        if proc_field(supervisor, 19) == str(unit["starttime"]):
            os.kill(supervisor, signal.SIGKILL)



def finished(events: queue.Queue, *units: str, timeout: float = 30) -> dict[str, UnitFinished]:
    """The first UnitFinished of each of `units` from a LocalHost's event queue (a lost unit's may
    come twice: the controller keeps the first)."""
    got: dict[str, UnitFinished] = {}
    while not got.keys() >= set(units):
        event = events.get(timeout=timeout)
        if isinstance(event, UnitFinished):
            got.setdefault(event.unit, event)
    return got


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def zygote_of(host: LocalHost) -> int:
    """The agent's zygote: its one child that is no job's supervisor (those are the zygote's)."""
    return wait_until(lambda: children(host.agent_pid) and children(host.agent_pid)[0], 10, "the agent's zygote")
