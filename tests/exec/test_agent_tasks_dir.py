"""A plain supervisor lists its unit's host directory for tasks of `xce launch` at the start of its
wait only when tasks may already wait there (the agent made the directory first, or hooks ran,
which may take a TASKS_SIGNAL): a directory it made itself was empty then, and a task written
later comes with TASKS_SIGNAL. A forked supervisor (fork_detached) on a throw-away spool."""

from __future__ import annotations

import json
import os
import sys

from xce_lite.exec.agent.journal import parse_records
from xce_lite.exec.agent.recorders import JournalRecorder
from xce_lite.exec.agent.supervisor import become_supervisor, fork_detached


def supervise(tmp_path, spec: dict) -> list[str]:
    """Run `spec` under a forked supervisor; the directories it listed, in order."""
    spool, listed = tmp_path / "spool", tmp_path / "listed"
    spool.mkdir(exist_ok=True)

    def run() -> None:
        real = os.listdir

        def listdir(path="."):
            with open(listed, "a") as f:
                f.write(f"{path}\n")
            return real(path)

        os.listdir = listdir  # this forked child's only
        become_supervisor(JournalRecorder(str(spool), spec["unit"], "boot"), spec, 1.0, detach=True)

    _pid, status = os.waitpid(fork_detached(run), 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return listed.read_text().splitlines() if listed.exists() else []


def records(tmp_path) -> list[dict]:
    """The journal's records (no `launched`: the agent writes those, and there is none here)."""
    data = (tmp_path / "spool" / "journal").read_bytes()
    return [rec for rec, _end in parse_records(data[: data.rfind(b"\n") + 1], 0)]


def job(tmp_path, name: str, argv: list[str]) -> dict:
    return {"unit": name, "argv": argv, "env": {"PATH": os.environ["PATH"]}, "cwd": str(tmp_path),
            "stdout": str(tmp_path / f"{name}.out"), "stderr": None, "grace": 2, "role": "job",
            "host_dir": str(tmp_path / "units" / name), "host_dir_by": "supervisor", "hostfile": "h1 slots=1\n"}


def test_a_host_directory_the_supervisor_made_is_not_listed_for_tasks(tmp_path):
    (tmp_path / "units").mkdir()
    assert supervise(tmp_path, job(tmp_path, "fresh", ["true"])) == []
    assert [r["result"]["exit_code"] for r in records(tmp_path) if r["event"] == "finished"] == [0]
    assert not (tmp_path / "units" / "fresh").exists()


def test_tasks_the_agent_left_before_the_supervisor_made_its_directory_still_run(tmp_path):
    host_dir = tmp_path / "units" / "early"
    host_dir.mkdir(parents=True)  # as op_tasks does when the supervisor has not made it yet
    task = {"index": 0, "argv": [sys.executable, "-c", "print('task ran')"], "env": {}, "cwd": str(tmp_path)}
    (host_dir / "tasks-l1.json").write_text(json.dumps({"launch_id": "l1", "tasks": [task]}))
    # the job outlives its task's start: the task starts at the wait's beginning, then ends with the unit
    listed = supervise(tmp_path, job(tmp_path, "early", [sys.executable, "-c", "import time; time.sleep(0.5)"]))
    assert listed == [str(host_dir)]
    assert (tmp_path / "early.out").read_text() == "task ran\n"
