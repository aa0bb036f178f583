"""A direct unit's stop script (systemd.STOP_SCRIPT) and the agent's reading of what it leaves
(systemd.stop_records), without systemd: the script is run here by /bin/sh with the variables
systemd gives an ExecStopPost (EXIT_CODE, EXIT_STATUS, SERVICE_RESULT).

The script writes THE finished record to the unit's own file in its host directory with shell
builtins alone (no flock, no sync: each was an exec per unit), never the journal; the agent appends
it to the journal, fdatasync'ed, before it reports it (state.UnitState.take_records).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from xce_lite.exec.agent.journal import Unit
from xce_lite.exec.agent.jsonl import loads
from xce_lite.exec.agent.systemd import STOP_RECORD, stop_record, stop_records, unit_scripts

UNIT = "xce-j-7-stoprec"
BOOT = "170000000000"  # the boot's epoch in 1/100 s: only the end time depends on it


def run_stop(spool: Path, env: dict[str, str], kill_reason: bytes | None = None,
             trace: Path | None = None) -> subprocess.CompletedProcess:
    """Run the spool's stop script for UNIT as systemd would run its ExecStopPost (under strace
    with `trace`)."""
    (spool / "bin").mkdir(parents=True, exist_ok=True)
    (spool / "units" / UNIT).mkdir(parents=True, exist_ok=True)
    if kill_reason is not None:
        (spool / "units" / UNIT / "kill_reason").write_bytes(kill_reason)
    _exec, stop = unit_scripts(str(spool), "v2")
    argv = ["/bin/sh", stop, UNIT, "1700000000.5", "systemd", "-", "-", BOOT]
    if trace is not None:  # strace comes with the test dependencies (tests/install_test_deps.sh)
        assert shutil.which("strace"), "strace is missing: run tests/install_test_deps.sh"
        argv = ["strace", "-f", "-qq", "-e", "trace=execve,fork,vfork,clone,clone3", "-o", str(trace), *argv]
    return subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30)


def test_the_stop_script_writes_the_record_to_the_units_own_file_and_runs_no_program(tmp_path):
    spool, trace = tmp_path / "spool", tmp_path / "trace"
    done = run_stop(spool, {"EXIT_CODE": "exited", "EXIT_STATUS": "3", "SERVICE_RESULT": "exit-code"}, trace=trace)
    assert done.returncode == 0, done.stderr
    text = (spool / "units" / UNIT / STOP_RECORD).read_text()
    assert text.endswith("}}\n") and text.count("\n") == 1
    rec = loads(text)
    assert rec["event"] == "finished" and rec["unit"] == UNIT
    result = rec["result"]
    assert (result["exit_code"], result["signal"], result["reason"]) == (3, None, None)
    assert (result["service_result"], result["mode"], result["start_time"]) == ("exit-code", "systemd", 1700000000.5)
    assert not (spool / "journal").exists()  # the agent appends it there, fdatasync'ed
    calls = [line.split(None, 1)[1] for line in trace.read_text().splitlines()]
    assert [c for c in calls if c.startswith("execve(")] == [c for c in calls if c.startswith('execve("/bin/sh"')]
    assert len(calls) == 1, calls  # /bin/sh's own exec: no fork, no flock, no sync


def test_a_killed_job_and_a_kill_reason_are_worded_in_the_record(tmp_path):
    spool = tmp_path / "spool"
    done = run_stop(spool, {"EXIT_CODE": "killed", "EXIT_STATUS": "TERM", "SERVICE_RESULT": "signal"})
    assert done.returncode == 0, done.stderr
    result = stop_record(str(spool / "units" / UNIT), UNIT)
    assert result is not None and (result["exit_code"], result["signal"]) == (None, 15)
    assert result["reason"] == "killed by signal SIGTERM"
    os.unlink(spool / "units" / UNIT / STOP_RECORD)
    run_stop(spool, {"EXIT_CODE": "killed", "EXIT_STATUS": "TERM", "SERVICE_RESULT": "signal"},
             kill_reason=b'"killed by alice"\n')  # as the agent writes it
    assert stop_record(str(spool / "units" / UNIT), UNIT)["reason"] == "killed by alice"


def test_the_agent_takes_only_whole_records_of_direct_units_that_have_no_result(tmp_path):
    units_dir = tmp_path / "units"
    line = b'{"event":"finished","unit":"%s","result":{"exit_code":0,"service_result":"success"}}\n'
    files = {"whole": line % b"whole", "torn": (line % b"torn")[:-9], "other": line % b"whole",
             "unread": b"", "agent": line % b"agent", "done": line % b"done", "sup": line % b"sup"}
    for unit, data in files.items():
        (units_dir / unit).mkdir(parents=True)
        (units_dir / unit / STOP_RECORD).write_bytes(data)
    direct = {"stdout": "/dev/null", "stderr": None, "grace": 10.0}
    units = {unit: Unit(1.0, "systemd", dict(direct)) for unit in files}
    units["agent"].direct = {**direct, "record": "agent"}  # its end is read from systemd, not a file
    units["done"].result = {"exit_code": 1}  # the first result is the result
    units["sup"].direct = None  # a supervised unit records its own end in the journal
    got = stop_records(str(units_dir), units, [*files, "missing"])
    assert [loads(x)["unit"] for x in got.split(b"\n") if x] == ["whole"]
    assert loads(got)["result"] == {"exit_code": 0, "service_result": "success"}
