"""The host agent on real processes, through its raw protocol: a unit never runs twice, jobs outlive
their agent and are adopted, and the journal (durable results, reboots, torn lines, compaction).

The spool's journal is read here by journal(), written for the tests, not with the agent's reader;
the few tests that need to look inside the agent (when it fdatasyncs) import it in process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.support.agent_local import AGENT, PY, WAIT_JOB, journal, journal_result
from tests.support.procs import proc_field
from tests.support.raw_agent import job_pid, py, supervisor_pid, unit
from tests.support.waiting import wait_until


# ---------------------------------------------------------------- never twice, adoption, recovery


def test_repeated_launch_never_runs_a_unit_twice(agent, tmp_path):
    counter, release = tmp_path / "count", tmp_path / "release"
    code = f"open({str(counter)!r}, 'a').write('ran\\n')\n" + WAIT_JOB
    once = unit("once", py(code, str(release)), tmp_path)
    replies = agent.launch(once, once)
    assert [r["status"] for r in replies] == ["started", "running"]
    assert agent.launch(once)[0]["status"] == "running"
    release.touch()
    agent.finished("once")
    agent.events.clear()
    [again] = agent.launch(once)
    assert again["status"] == "finished" and again["result"]["exit_code"] == 0
    assert agent.finished("once")["exit_code"] == 0  # the event is sent again for the adopter
    assert counter.read_text() == "ran\n"


def test_refused_launches_say_why(agent, tmp_path):
    replies = agent.launch(
        unit("nocwd", ["true"], tmp_path, cwd=str(tmp_path / "absent")),
        unit("noargv", [], tmp_path),
        unit("../escape", ["true"], tmp_path),
        unit("badenv", ["true"], tmp_path, env={"A=B": "x"}),
        unit("relout", ["true"], tmp_path, stdout="out.txt"),
    )
    assert [r["status"] for r in replies] == ["refused"] * 5
    assert "is not an existing directory" in replies[0]["error"]
    assert "argv must be a non-empty list" in replies[1]["error"]
    assert "bad unit name" in replies[2]["error"]
    assert "env names" in replies[3]["error"]
    assert "stdout must be an absolute path" in replies[4]["error"]
    assert journal(agent.spool) == {} and not (tmp_path / "escape").exists()


def test_jobs_survive_agent_kill_and_a_new_agent_adopts_them(agents, spool, tmp_path):
    first = agents()
    first.launch(
        unit("early", py(WAIT_JOB, str(tmp_path / "go-early"), "3"), tmp_path),
        unit("late", py(WAIT_JOB, str(tmp_path / "go-late"), "4"), tmp_path),
        unit("third", py(WAIT_JOB, str(tmp_path / "go-third"), "5"), tmp_path),
    )
    pids = {u: job_pid(spool, u) for u in ("early", "late", "third")}
    first.proc.kill()
    first.close()
    (tmp_path / "go-early").touch()
    wait_until(lambda: journal_result(spool, "early"), 10, "early's result with no agent")
    assert proc_field(pids["late"], 0) is not None, "a job died with its agent"

    second = agents()
    listed = {u["unit"]: u for u in second.request("list")["units"]}
    assert listed["early"]["status"] == "finished" and listed["early"]["result"]["exit_code"] == 3
    assert listed["late"]["status"] == "running" and listed["late"]["result"] is None
    assert second.launch(unit("third", ["true"], tmp_path))[0]["status"] == "running"
    (tmp_path / "go-late").touch()
    (tmp_path / "go-third").touch()
    assert second.finished("late")["exit_code"] == 4  # adopted through list
    assert second.finished("third")["exit_code"] == 5  # adopted through launch


def test_killed_supervisor_is_reported_lost(agents, spool, tmp_path):
    first = agents()
    first.launch(unit("orphan", py(WAIT_JOB, str(tmp_path / "never")), tmp_path))
    pid = job_pid(spool, "orphan")
    first.proc.kill()  # so that the new agent, not a parent, finds the dead supervisor
    first.close()
    supervisor = supervisor_pid(spool, "orphan")
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: proc_field(supervisor, 0) in (None, "Z"), 5, "the supervisor to die")
    second = agents()
    [listed] = second.request("list")["units"]
    assert listed["status"] == "finished" and listed["result"]["exit_code"] is None
    assert listed["result"]["reason"].startswith("supervisor lost")
    wait_until(lambda: proc_field(pid, 0) in (None, "Z"), 5, "the unsupervised job to be killed")
    assert second.request("list")["units"] == [listed]  # the answer is stable


def test_supervisor_killed_under_its_agent_sends_finished(agent, tmp_path):
    agent.launch(unit("lost", py(WAIT_JOB, str(tmp_path / "never")), tmp_path))
    job_pid(agent.spool, "lost")
    supervisor = supervisor_pid(agent.spool, "lost")
    os.kill(supervisor, signal.SIGKILL)
    assert agent.finished("lost")["reason"].startswith("supervisor lost")


def test_agent_exits_on_eof_and_the_job_goes_on(agent, spool, tmp_path):
    agent.launch(unit("keep", py(WAIT_JOB, str(tmp_path / "go"), "7"), tmp_path))
    pid = job_pid(spool, "keep")
    agent.proc.stdin.close()
    assert agent.proc.wait(10) == 0
    assert agent.eof.wait(5), "the agent's stdout stayed open: a supervisor kept the pipe"
    assert proc_field(pid, 0) not in (None, "Z")
    (tmp_path / "go").touch()
    result = wait_until(lambda: journal_result(spool, "keep"), 10, "the result of the orphaned job")
    assert result["exit_code"] == 7


def test_forget_removes_finished_units_and_refuses_running_ones(agent, spool, tmp_path):
    agent.launch(unit("done", ["true"], tmp_path), unit("busy", py(WAIT_JOB, str(tmp_path / "go")), tmp_path))
    agent.finished("done")
    reply = agent.request("forget", units=["done", "busy", "never-was"])
    by_unit = {u["unit"]: u for u in reply["units"]}
    assert by_unit["done"]["ok"] and by_unit["never-was"]["ok"]
    assert not by_unit["busy"]["ok"] and "still running" in by_unit["busy"]["error"]
    assert list(journal(spool)) == ["busy"]
    assert [u["unit"] for u in agent.request("list")["units"]] == ["busy"]
    (tmp_path / "go").touch()
    agent.finished("busy")


def test_a_second_agent_on_a_busy_spool_stops_with_why(agents):
    first = agents()
    first.request("hello")
    second = agents("--lock-timeout", "0.2")
    assert second.proc.wait(10) == 2
    second.eof.wait(5)
    [fatal] = second.events
    assert fatal["event"] == "fatal" and f"pid {first.proc.pid}" in fatal["error"]


def test_exec_mode_supervises_a_prepared_unit_dir(tmp_path):
    unit_dir = tmp_path / "spool" / "by-hand"
    unit_dir.mkdir(parents=True)
    spec = unit("by-hand", py("print('hi'); raise SystemExit(5)"), tmp_path)
    (unit_dir / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([PY, "-S", "-E", str(AGENT), "exec", str(unit_dir)], timeout=30, check=False)
    assert done.returncode == 0
    result = json.loads((unit_dir / "result.json").read_text())
    assert result["exit_code"] == 5 and (tmp_path / "by-hand.out").read_text() == "hi\n"


# ---------------------------------------------------------------- the journal




def counted(counter: Path, *wait_args: str) -> list[str]:
    """A job that appends a line to `counter` when it runs, then behaves as WAIT_JOB."""
    return py(f"open({str(counter)!r}, 'a').write('ran\\n')\n" + WAIT_JOB, *wait_args)


def test_the_spool_holds_no_file_per_unit(agent, spool, tmp_path):
    agent.launch(*(unit(f"n{i}", ["true"], tmp_path) for i in range(20)))
    for i in range(20):
        agent.finished(f"n{i}")
    assert sorted(p.name for p in spool.iterdir()) == [".lock", "agent.sock", "bin", "journal", "units"]
    kept = [p for p in (spool / "units").iterdir()]  # the reused supervisors' kept host directories (hostdirs.py)
    assert all(p.name.startswith(".w-") and list(p.iterdir()) == [] for p in kept) and len(kept) <= 20
    [code] = [p.name for p in (spool / "bin").iterdir() if p.name != "xce"]  # the agent runs as bytecode
    assert code.startswith("agent-") and code.endswith(".pyc")
    assert sorted(journal(spool)) == sorted(f"n{i}" for i in range(20))


def test_the_result_is_in_the_journal_when_the_finished_event_is_sent(agent, spool, tmp_path):
    seen = {}
    agent.on_event = lambda event: seen.setdefault(event["unit"], journal_result(spool, event["unit"]))
    agent.launch(*(unit(f"r{i}", py(f"raise SystemExit({i})"), tmp_path) for i in range(5)))
    for i in range(5):
        assert agent.finished(f"r{i}")["exit_code"] == i
        assert seen[f"r{i}"] == agent.finished(f"r{i}")


def test_the_result_is_fdatasynced_before_the_finished_event_is_written(agents, spool, tmp_path):
    # strace comes with the test dependencies (tests/install_test_deps.sh): its absence is a failure
    assert shutil.which("strace"), "strace is missing: run tests/install_test_deps.sh"
    log = tmp_path / "strace.log"
    agent = agents(prefix=("strace", "-f", "-qq", "-s", "300", "-e", "trace=write,fdatasync", "-o", str(log)))
    agent.launch(unit("synced", py("raise SystemExit(9)"), tmp_path))
    assert agent.finished("synced")["exit_code"] == 9
    lines = log.read_text().splitlines()
    event = next(i for i, line in enumerate(lines) if "write(1," in line and '\\"event\\":\\"finished\\"' in line)
    record = next(i for i, line in enumerate(lines) if '\\"event\\":\\"finished\\",\\"unit\\":\\"synced\\"' in line)
    synced = [i for i, line in enumerate(lines) if "fdatasync" in line and line.endswith("= 0")]
    assert any(record < i < event for i in synced), "the record was not fdatasynced before the event was sent"


def test_a_finished_unit_survives_a_reboot_and_is_never_run_again(agents, spool, tmp_path):
    counter = tmp_path / "count"
    first = agents()
    first.launch(unit("done", counted(counter, str(tmp_path / "go")), tmp_path))
    (tmp_path / "go").touch()
    assert first.finished("done")["exit_code"] == 0
    first.launch(unit("cut", counted(counter, str(tmp_path / "never")), tmp_path))
    job, supervisor = job_pid(spool, "cut"), supervisor_pid(spool, "cut")
    wait_until(lambda: counter.read_text() == "ran\nran\n", 10, "the second job to run")
    # The power goes out: every process dies, and the next boot has another boot id.
    first.proc.kill()
    first.close()
    os.kill(supervisor, signal.SIGKILL)
    os.killpg(job, signal.SIGKILL)
    wait_until(lambda: proc_field(job, 0) in (None, "Z"), 5, "the job to die")
    boot = journal(spool)["cut"]["boot"]
    path = spool / "journal"
    path.write_text(path.read_text().replace(boot, "00000000-0000-0000-0000-000000000000"))

    second = agents()
    listed = {u["unit"]: u for u in second.request("list")["units"]}
    assert listed["done"]["status"] == "finished" and listed["done"]["result"]["exit_code"] == 0
    assert listed["cut"]["status"] == "finished" and listed["cut"]["result"]["exit_code"] is None
    assert listed["cut"]["result"]["reason"].startswith("supervisor lost: the host restarted")
    again = second.launch(unit("done", counted(counter), tmp_path), unit("cut", counted(counter), tmp_path))
    assert [r["status"] for r in again] == ["finished", "finished"]
    assert again[0]["result"] == listed["done"]["result"] and again[1]["result"] == listed["cut"]["result"]
    assert counter.read_text() == "ran\nran\n"  # each ran once, before the "reboot"


def test_a_unit_launched_but_never_started_is_lost_not_started(agents, spool, tmp_path):
    spool.mkdir()
    (spool / "journal").write_bytes(b'\n{"event":"launched","unit":"ghost","start_time":1.5}\n')
    agent = agents()
    [reply] = agent.launch(unit("ghost", counted(tmp_path / "count"), tmp_path))
    assert reply["status"] == "finished" and reply["start_time"] == 1.5
    assert reply["result"]["exit_code"] is None and reply["result"]["reason"].startswith("supervisor lost")
    assert journal_result(spool, "ghost") == reply["result"]
    assert not (tmp_path / "count").exists()


def test_torn_and_foreign_lines_in_the_journal_are_skipped(agents, spool, tmp_path):
    spool.mkdir()
    (spool / "journal").write_bytes(
        b'\n{"event":"journal","version":1}\n'
        b'\n{"event":"launched","unit":"old","start_time":2.0}\n'
        b"\nnot json at all\n"
        b'\n{"event":"finished","unit":"old","result":{"exit_code":0,"signal":null,"start_time":2.0,'
        b'"end_time":3.0,"cpu_time":0.0,"max_rss":0,"reason":null}}\n'
        b'\n["a list"]\n\n{"event":"mystery","unit":"old"}\n'
        b'\n{"event":"finished","unit":"old","res'  # torn: a writer died in mid-record
    )
    agent = agents()
    agent.launch(unit("new", py("raise SystemExit(4)"), tmp_path))
    assert agent.finished("new")["exit_code"] == 4
    listed = {u["unit"]: u for u in agent.request("list")["units"]}
    assert sorted(listed) == ["new", "old"] and listed["old"]["result"]["end_time"] == 3.0
    assert listed["new"]["result"]["exit_code"] == 4


def test_compaction_keeps_the_live_units_and_their_supervisors_write_to_the_new_file(agents, spool, tmp_path):
    counter = tmp_path / "count"
    first = agents("--journal-limit", "3000")
    first.launch(unit("long", counted(counter, str(tmp_path / "go"), "6"), tmp_path))
    job_pid(spool, "long")
    assert first.request("signal", unit="long", signal="STOP", reason="stopped")["found"]
    assert first.request("signal", unit="long", signal="CONT", reason="kept across compactions")["found"]
    inodes = {(spool / "journal").stat().st_ino}
    for batch in range(6):
        names = [f"b{batch}-{i}" for i in range(10)]
        first.launch(*(unit(name, ["true"], tmp_path) for name in names))
        for name in names:
            first.finished(name)
        assert all(u["ok"] for u in first.request("forget", units=names)["units"])
        inodes.add((spool / "journal").stat().st_ino)
    assert len(inodes) > 1, "the journal was never compacted"
    assert (spool / "journal").stat().st_size < 12000  # 60 units' records alone take ~35 kB
    assert not (spool / "journal.new").exists()
    kept = journal(spool)
    assert list(kept) == ["long"] and kept["long"]["kill"] == "kept across compactions"
    first.close()

    second = agents("--journal-limit", "3000")
    [listed] = second.request("list")["units"]
    assert listed["unit"] == "long" and listed["status"] == "running"
    (tmp_path / "go").touch()
    assert second.finished("long")["exit_code"] == 6  # appended to the compacted journal
    assert journal_result(spool, "long")["exit_code"] == 6
    assert counter.read_text() == "ran\n"


def test_a_forgotten_unit_runs_again_and_its_old_kill_reason_is_not_reused(agent, spool, tmp_path):
    counter = tmp_path / "count"
    agent.launch(unit("again", counted(counter, str(tmp_path / "never")), tmp_path))
    wait_until(lambda: counter.exists(), 10, "the job to run")
    assert agent.request("signal", unit="again", signal="TERM", reason="first time")["found"]
    assert agent.finished("again")["reason"] == "first time"
    agent.request("forget", units=["again"])
    agent.events.clear()
    [reply] = agent.launch(unit("again", counted(counter, str(tmp_path / "never")), tmp_path))
    assert reply["status"] == "started"
    wait_until(lambda: counter.read_text() == "ran\nran\n", 10, "the job to run again")
    os.kill(supervisor_pid(spool, "again"), signal.SIGTERM)  # an admin's kill: no reason recorded
    assert agent.finished("again")["reason"] == "killed"
    assert counter.read_text() == "ran\nran\n"


def test_jobs_inherit_no_fd_of_the_agent(agents, tmp_path):
    leak_r, leak_w = os.pipe()
    try:
        agent = agents(pass_fds=(leak_r, leak_w))
        code = "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
        agent.launch(unit("fds", py(code), tmp_path))
        agent.finished("fds")
    finally:
        os.close(leak_r)
        os.close(leak_w)
    assert (tmp_path / "fds.out").read_text() == "[0, 1, 2, 3]\n"  # 3: the listing's own fd


def test_a_result_not_known_durable_is_fdatasynced_by_the_agent_before_it_goes_out(tmp_path, monkeypatch):
    """In process: a result appended without fdatasync by a supervisor the agent did not fork (one
    that died between its write and its fdatasync, say) makes the agent sync before it writes."""
    from xce_lite.exec.agent import journal as agent_py
    from xce_lite.exec.agent.server import Agent

    spool = tmp_path / "spool"
    spool.mkdir()
    agent = Agent(str(spool), "h")
    agent.unit_state.append(agent_py.record("launched", unit="x", start_time=1.0))
    result = {"exit_code": 0, "signal": None, "start_time": 1.0, "end_time": 2.0, "cpu_time": 0, "max_rss": 0}
    agent_py.append_shared(agent.state.journal_path, agent_py.record("finished", unit="x", result=result), sync=False)
    synced = []
    monkeypatch.setattr(agent_py.os, "fdatasync", synced.append)
    monkeypatch.setattr(agent_py.os, "write", lambda fd, data: synced.append(("write", fd)) or len(data))
    assert agent.reads.op_list({})["units"][0]["result"] == result
    agent.state.out.append(b"the reply\n")
    agent.flush()
    assert synced == [agent.state.jfd, ("write", 1)]
    agent.unit_state.reported("x", result)  # now known durable: no second sync
    agent.flush()
    assert synced == [agent.state.jfd, ("write", 1)]
    os.close(agent.state.jfd)


def test_a_new_journal_is_made_durable_with_its_name(tmp_path, monkeypatch):
    """In process: results fdatasync'ed into a file whose directory entry an OS crash can lose would
    be lost with it, so a new journal is fsynced with the spool's directory and the spool's name."""
    from xce_lite.exec.agent import state as agent_py
    from xce_lite.exec.agent.server import Agent

    synced_dirs = []
    monkeypatch.setattr(agent_py, "fsync_dir", synced_dirs.append)
    spool = tmp_path / "spool"
    spool.mkdir()
    for _ in range(2):  # the second time, the journal exists: nothing to do
        os.close(Agent(str(spool), "h").state.jfd)
        assert synced_dirs == [str(spool), str(tmp_path)]
