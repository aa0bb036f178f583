"""The host agent on real processes, through its raw protocol: version 2's modes and host facts,
reading files, what a job gets (host dir, unit socket, the `xce` shim, hostfiles), and `xce launch`
(tasks inside a unit, plain mode).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support.agent_local import AGENT, PY, journal, kill_leftovers
from tests.support.procs import proc_field
from tests.support.raw_agent import RawAgent, py, supervisor_pid, unit
from tests.support.waiting import wait_until


# ---------------------------------------------------------------- protocol version 2: modes and host facts


def test_auto_picks_the_first_mode_the_host_can_do_and_says_why_not_the_others(agents):
    reply = agents("--mode", "auto").request("hello")
    modes = reply["modes"]
    assert reply["mode"] == next(m for m in ("systemd", "user", "plain") if modes[m]["ok"])
    assert all(modes[m]["ok"] or modes[m]["why"] for m in ("systemd", "user"))
    if not os.path.isdir("/run/systemd/system"):  # this machine: its PID 1 is not systemd
        assert reply["mode"] == "plain" and not modes["systemd"]["ok"]
        assert "no /run/systemd/system" in modes["systemd"]["why"] or "need root" in modes["systemd"]["why"]


def test_an_explicit_mode_the_host_cannot_do_is_fatal_and_says_why(agents, tmp_path):
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "no-runtime-dir")}
    agent = agents("--mode", "user", env=env)
    assert agent.eof.wait(10)
    [fatal] = agent.events
    assert fatal["event"] == "fatal" and "mode user" in fatal["error"]
    assert f"XDG_RUNTIME_DIR {tmp_path / 'no-runtime-dir'} does not exist" in fatal["error"]
    assert agent.proc.wait(10) == 2


def test_an_unknown_mode_is_fatal(agents):
    agent = agents("--mode", "systemdd")
    assert agent.eof.wait(10)
    assert "unknown mode 'systemdd'" in agent.events[0]["error"] and agent.proc.wait(10) == 2


def test_an_unknown_records_choice_is_fatal_and_names_both(agents):
    agent = agents("--records", "script")
    assert agent.eof.wait(10)
    error = agent.events[0]["error"]
    assert "unknown --records 'script'" in error and "unit" in error and "agent" in error
    assert agent.proc.wait(10) == 2


def test_hello_lists_gpus_as_nvidia_smi_reports_them_and_never_fails_because_of_it(agents, tmp_path):
    """A stand-in nvidia-smi on the agent's PATH: this machine has no GPU, and the agent only reads
    the command's output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA A100-SXM4-40GB, 40960'\necho '1, Tesla T4, 15360'\n")
    smi.chmod(0o755)
    agent = agents(env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert agent.request("hello")["gpus"] == [
        {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory": 40960 << 20},
        {"index": 1, "name": "Tesla T4", "memory": 15360 << 20},
    ]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver' >&2\nexit 9\n")
    reply = agent.request("hello")
    assert reply["ok"] and reply["gpus"] == []


def test_ping_answers_with_the_hosts_clock(agent):
    before = time.time()
    reply = agent.request("ping")
    assert reply["ok"] and before <= reply["time"] <= time.time()


def test_read_returns_a_piece_of_a_file_and_where_it_ended(agent, tmp_path):
    f = tmp_path / "out.txt"
    f.write_bytes(b"hello\nworld\n\xff")
    first = agent.request("read", path=str(f), offset=0, max=6)
    assert base64.b64decode(first["data_b64"]) == b"hello\n"
    assert (first["offset"], first["size"], first["eof"]) == (6, 13, False)
    rest = agent.request("read", path=str(f), offset=first["offset"])
    assert base64.b64decode(rest["data_b64"]) == b"world\n\xff" and (rest["offset"], rest["eof"]) == (13, True)
    at_end = agent.request("read", path=str(f), offset=13, max=10)
    assert at_end["data_b64"] == "" and at_end["eof"]


def test_read_says_what_is_wrong_with_the_request(agent, tmp_path):
    cases = {
        "No such file or directory": {"path": str(tmp_path / "missing.out")},
        "Is a directory": {"path": str(tmp_path)},
        "absolute path": {"path": "relative.out"},
        "max must be an integer from 0 to 1048576": {"path": str(AGENT), "max": 2 << 20},
        "offset must be an integer": {"path": str(AGENT), "offset": -1},
    }
    for words, fields in cases.items():
        reply = agent.request("read", **fields)
        assert not reply["ok"] and words in reply["error"], (fields, reply)
    assert "missing.out" in agent.request("read", path=str(tmp_path / "missing.out"))["error"]


def test_refused_roles_and_hostfiles_say_why(agent, tmp_path):
    bad = {
        "neither 'job'": unit("r1", ["true"], tmp_path, role="boss"),
        "hostfile must be text": unit("r2", ["true"], tmp_path, hostfile=["host1"]),
        "argv must be a non-empty list": unit("r3", [], tmp_path),
    }
    replies = agent.launch(*bad.values())
    for words, reply in zip(bad, replies):
        assert reply["status"] == "refused" and words in reply["error"], reply


# ---------------------------------------------------------------- what a job gets


def test_the_job_gets_its_host_dir_unit_socket_and_the_xce_shim_last_in_path(agent, spool, tmp_path):
    code = (
        "import json, os\nd = os.environ['XCE_JOB_HOST_DIR']\n"
        "print(json.dumps({'env': {k: v for k, v in os.environ.items() if k.startswith('XCE_') or k == 'PATH'},"
        " 'dir': os.path.isdir(d), 'mode': oct(os.stat(d).st_mode & 0o777)}))"
    )
    agent.launch(unit("envy", py(code), tmp_path, env={"PATH": "/usr/bin:/bin"}))
    result = agent.finished("envy")
    got = json.loads((tmp_path / "envy.out").read_text())
    host_dir = spool / "units" / "envy"
    assert got["env"] == {
        "PATH": f"/usr/bin:/bin:{spool}/bin",
        "XCE_UNIT": "envy",
        "XCE_JOB_HOST_DIR": str(host_dir),
        "XCE_LAUNCH_SOCKET": str(spool / "agent.sock"),
    }
    assert got["dir"] and got["mode"] == "0o700"
    assert not host_dir.exists()  # removed once the result was durable, before it was reported
    assert result["exit_code"] == 0 and result["mode"] == "plain" and result["service_result"] is None


def test_a_hostfile_is_written_to_the_host_dir_and_named_in_the_env(agent, spool, tmp_path):
    hostfile = "host1 slots=2\nhost2 slots=2\n"
    code = "import os\nprint(os.environ['XCE_HOSTFILE']); print(open(os.environ['XCE_HOSTFILE']).read(), end='')"
    agent.launch(unit("mpi", py(code), tmp_path, hostfile=hostfile))
    assert agent.finished("mpi")["exit_code"] == 0
    assert (tmp_path / "mpi.out").read_text() == f"{spool / 'units' / 'mpi' / 'hostfile'}\n{hostfile}"


def test_a_host_unit_runs_no_command_and_holds_until_it_is_killed(agent, spool, tmp_path):
    [reply] = agent.launch(unit("hold", [], tmp_path, role="host"))
    assert reply["status"] == "started"
    supervisor_pid(spool, "hold")
    assert journal(spool)["hold"]["job"] == 0  # no job process
    [listed] = agent.request("list")["units"]
    assert listed["status"] == "running" and not [e for e in agent.events if e.get("unit") == "hold"]
    assert agent.request("signal", unit="hold", signal="TERM", reason="job 5 ended")["found"]
    result = agent.finished("hold")
    assert (result["exit_code"], result["signal"], result["reason"]) == (0, None, "job 5 ended")


# ---------------------------------------------------------------- `xce launch` (plain mode)

LAUNCHING_JOB = 'xce launch -- "$@"; echo "launch exited $?"'
TASK = (
    "import os, sys\ni = int(os.environ['XCE_TASK_INDEX'])\n"
    "print(f'task {i} of {os.environ[\"XCE_UNIT\"]} in session {os.getsid(0)}', flush=True)\nsys.exit(3 + i)\n"
)


def launching(name: str, tmp: Path, *command: str) -> dict:
    """A unit whose job runs `xce launch -- COMMAND` (through the agent's shim: only /usr/bin:/bin
    come before it, so an installed xce is not found first) and prints its exit code."""
    return unit(name, ["sh", "-c", LAUNCHING_JOB, "sh", *command], tmp, env={"PATH": "/usr/bin:/bin"})


def launch_request(agent: RawAgent, unit_name: str) -> dict:
    def find():
        return next((e for e in agent.events if e["event"] == "launch_requested" and e["unit"] == unit_name), None)

    return wait_until(find, 20, f"the launch_requested event of {unit_name}")


def task_ends(agent: RawAgent, launch_id: str, n: int) -> list[dict]:
    def find():
        ends = [e for e in agent.events if e["event"] == "task_finished" and e["launch_id"] == launch_id]
        return sorted(ends, key=lambda e: e["index"]) if len(ends) >= n else None

    return wait_until(find, 20, f"{n} task_finished events of {launch_id}")


def test_xce_launch_runs_tasks_inside_the_unit_and_exits_with_the_code_it_is_given(agent, spool, tmp_path):
    agent.launch(launching("par", tmp_path, PY, "-c", TASK))
    req = launch_request(agent, "par")
    assert req["argv"] == [PY, "-c", TASK] and req["cwd"] == str(tmp_path) and req["env"]["XCE_UNIT"] == "par"
    tasks = [{"index": i, "argv": req["argv"], "env": {**req["env"], "XCE_TASK_INDEX": str(i)}, "cwd": req["cwd"]}
             for i in (0, 1)]
    assert agent.request("tasks", unit="par", launch_id=req["launch_id"], tasks=tasks)["accepted"] == 2
    ends = task_ends(agent, req["launch_id"], 2)
    assert [(e["index"], e["exit_code"], e["signal"], e["error"]) for e in ends] == [(0, 3, None, None),
                                                                                     (1, 4, None, None)]
    # a repeated request (a controller that reconnected, say) starts nothing twice
    assert agent.request("tasks", unit="par", launch_id=req["launch_id"], tasks=tasks)["ok"]
    wait_until(lambda: not list((spool / "units" / "par").glob("tasks-*")), 10, "the supervisor to take the tasks")
    assert agent.request("launch_done", launch_id=req["launch_id"], exit_code=7)["delivered"]
    assert agent.finished("par")["exit_code"] == 0
    out = (tmp_path / "par.out").read_text()
    session = journal(spool)["par"]["pid"]  # the supervisor's: tasks run inside the unit
    assert out.count(f"task 0 of par in session {session}\n") == 1 and f"task 1 of par in session {session}\n" in out
    assert out.endswith("launch exited 7\n")


def test_a_task_that_cannot_start_is_reported_with_why(agent, tmp_path):
    agent.launch(unit("h", [], tmp_path, role="host"))
    supervisor_pid(agent.spool, "h")
    task = {"index": 4, "argv": ["no-such-command-xce"], "env": {"PATH": "/usr/bin:/bin"}, "cwd": str(tmp_path)}
    agent.request("tasks", unit="h", launch_id="h.l", tasks=[task])
    [end] = task_ends(agent, "h.l", 1)
    assert (end["exit_code"], end["signal"]) == (127, None) and "exec failed" in end["error"]
    agent.request("signal", unit="h", signal="TERM", reason="done")


def test_tasks_of_a_host_unit_are_killed_with_it(agent, spool, tmp_path):
    agent.launch(unit("h2", [], tmp_path, role="host"))
    supervisor = supervisor_pid(spool, "h2")
    pid_file = tmp_path / "task.pid"
    code = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(60)"
    task = {"index": 1, "argv": py(code, str(pid_file)), "env": {}, "cwd": str(tmp_path)}
    assert agent.request("tasks", unit="h2", launch_id="h2.l1", tasks=[task])["ok"]
    task_pid = wait_until(lambda: pid_file.exists() and int(pid_file.read_text() or 0), 10, "the task's pid")
    assert proc_field(task_pid, 3) == str(supervisor)  # its session: the unit's
    assert agent.request("signal", unit="h2", signal="TERM", reason="killed by bob")["found"]
    [end] = task_ends(agent, "h2.l1", 1)
    assert (end["exit_code"], end["signal"]) == (None, signal.SIGTERM)
    assert agent.finished("h2")["reason"] == "killed by bob"


def test_tasks_for_a_unit_that_does_not_run_are_refused(agent, tmp_path):
    task = {"index": 0, "argv": ["true"], "env": {}, "cwd": str(tmp_path)}
    reply = agent.request("tasks", unit="nope", launch_id="nope.1", tasks=[task])
    assert not reply["ok"] and "unit nope is not running on this host" in reply["error"]


def test_xce_launch_asks_the_next_agent_when_its_agent_goes_away(agents, spool, tmp_path):
    first = agents()
    first.launch(launching("re", tmp_path, "true"))
    req = launch_request(first, "re")
    first.close()  # the controller's connection dropped: the job's `xce launch` waits for the next agent
    second = agents()
    second.request("list")  # adopt "re"
    assert second.request("launch_done", launch_id=req["launch_id"], exit_code=5)["ok"]
    assert second.finished("re")["exit_code"] == 0
    assert (tmp_path / "re.out").read_text() == "launch exited 5\n"


def test_xce_launch_reaches_an_agent_whose_socket_path_is_longer_than_sun_path(tmp_path):
    spool = tmp_path / ("d" * 60) / ("e" * 60) / "spool"
    spool.parent.mkdir(parents=True)
    agent = RawAgent(spool)
    try:
        agent.launch(launching("long", tmp_path, "true"))
        req = launch_request(agent, "long")
        assert len(req["env"]["XCE_LAUNCH_SOCKET"]) > 108
        assert agent.request("launch_done", launch_id=req["launch_id"], exit_code=0)["delivered"]
        assert agent.finished("long")["exit_code"] == 0
        assert (tmp_path / "long.out").read_text() == "launch exited 0\n"
    finally:
        agent.close()
        kill_leftovers(spool)


def test_xce_launch_outside_a_job_says_where_it_works(agent, spool):
    agent.request("ping")  # the agent has written its shim
    env = {k: v for k, v in os.environ.items() if not k.startswith("XCE_")}
    done = subprocess.run([spool / "bin" / "xce", "launch", "--", "hostname"], env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 255 and "runs only inside an xce job" in done.stderr
