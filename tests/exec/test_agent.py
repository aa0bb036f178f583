"""The host agent on real processes, driven through its raw JSON-lines protocol (no xce_lite client
code): the file itself, how jobs end, limits and signals. Recovery and the journal are in
test_agent_recovery.py; protocol version 2, what a job gets and `xce launch` in test_agent_protocol.py.

Jobs are small Python programs run by this interpreter. Jobs that must stay running wait for a
"release" file (and give up by themselves after a minute), so nothing outlives a failed test.
"""

from __future__ import annotations

import ast
import os
import pwd
import shutil
import signal
import sys
from pathlib import Path

from tests.support.agent_local import AGENT, WAIT_JOB
from tests.support.procs import proc_field
from tests.support.raw_agent import job_pid, py, unit
from tests.support.waiting import wait_until


# ---------------------------------------------------------------- the file itself


def test_agent_imports_only_the_standard_library():
    tree = ast.parse(AGENT.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "agent.py must not use relative imports"
            modules.add(node.module.split(".")[0])
    assert "os" in modules  # the walk found the imports
    assert modules - set(sys.stdlib_module_names) == set(), "agent.py must import the standard library only"


def test_an_agent_started_from_source_runs_on_as_its_bytecode_same_pid(agent, spool):
    """Compiled at every start, the agent would carry the compiler's memory into every fork."""
    assert agent.request("hello")["pid"] == agent.proc.pid
    argv = Path(f"/proc/{agent.proc.pid}/cmdline").read_bytes().split(b"\0")
    code = Path(argv[3].decode())
    assert code.parent == spool / "bin" and code.name.startswith("agent-") and code.suffix == ".pyc"
    assert argv[1:3] == [b"-S", b"-E"] and argv[4] == b"serve"


def test_hello_describes_the_host(agent):
    reply = agent.request("hello")
    assert reply["ok"] and reply["version"] == 3
    assert reply["cpus"] >= 1 and reply["mem"] > 100 << 20
    assert reply["hostname"] == os.uname().nodename and reply["pid"] == agent.proc.pid
    assert reply["mode"] == "plain" and reply["modes"]["plain"] == {"ok": True, "why": None, "memory": "supervisor",
                                                                   "direct": False}
    assert len(reply["load"]) == 3 and all(x >= 0 for x in reply["load"])
    assert reply["user"] == pwd.getpwuid(os.getuid()).pw_name and reply["uid"] == os.getuid()
    assert reply["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert reply["python"] == sys.version.split()[0] and reply["cgroup"] in ("v1", "v2", "hybrid", None)
    assert reply["gpus"] == [] or shutil.which("nvidia-smi")


def test_unknown_op_says_what_the_agent_speaks(agent):
    reply = agent.request("frobnicate")
    assert not reply["ok"] and "speaks hello, ping, launch" in reply["error"] and "launch_done" in reply["error"]


# ---------------------------------------------------------------- how jobs end


def test_exit_code_times_cpu_and_max_rss(agent, tmp_path):
    code = "x = b'x' * (60 << 20)\nimport time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"
    [reply] = agent.launch(unit("big", py(code), tmp_path))
    assert reply["status"] == "started" and reply["error"] is None
    result = agent.finished("big")
    assert result["exit_code"] == 0 and result["signal"] is None and result["reason"] is None
    assert result["start_time"] == reply["start_time"] <= result["end_time"]
    assert result["cpu_time"] >= 0.2
    assert result["max_rss"] >= 50 << 20


def test_nonzero_exit(agent, tmp_path):
    agent.launch(unit("fail", py("import sys; sys.exit(3)"), tmp_path))
    result = agent.finished("fail")
    assert result["exit_code"] == 3 and result["reason"] is None


def test_command_not_found_ends_with_127_like_a_shell(agent, tmp_path):
    [reply] = agent.launch(unit("nocmd", ["no-such-command-xyz", "arg"], tmp_path))
    assert reply["status"] == "started"
    result = agent.finished("nocmd")
    assert result["exit_code"] == 127
    assert result["reason"] == "exec failed: No such file or directory: no-such-command-xyz"


def test_command_that_cannot_be_executed_ends_with_126(agent, tmp_path):
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    agent.launch(unit("noexec", [str(script)], tmp_path))
    result = agent.finished("noexec")
    assert result["exit_code"] == 126 and result["reason"] == f"exec failed: Permission denied: {script}"


def test_the_program_is_looked_up_in_the_jobs_path_like_execvp(agent, tmp_path):
    first, second, third = (tmp_path / d for d in ("first", "second", "third"))
    for d in (first, second, third):
        d.mkdir()
    (first / "prog").write_text("#!/bin/sh\nexit 11\n")  # not executable: skipped, as by execvp
    (second / "prog").write_text("#!/bin/sh\nexit 12\n")
    (second / "prog").chmod(0o755)
    (third / "other").write_text("#!/bin/sh\nexit 13\n")
    agent.launch(
        unit("found", ["prog"], tmp_path, env={"PATH": f"{first}:{second}"}),
        unit("denied", ["prog"], tmp_path, env={"PATH": f"{third}:{first}"}),
        unit("default", ["true"], tmp_path, env={}),
        unit("nopath", ["other"], tmp_path, env={}),
    )
    assert agent.finished("found")["exit_code"] == 12
    assert agent.finished("denied") == {**agent.finished("denied"), "exit_code": 126}
    assert agent.finished("denied")["reason"] == "exec failed: Permission denied: prog"
    assert agent.finished("default")["exit_code"] == 0  # no PATH: /bin:/usr/bin, as execvp
    assert agent.finished("nopath")["exit_code"] == 127


def test_unopenable_output_file_ends_the_job_with_why(agent, tmp_path):
    agent.launch(unit("noout", ["true"], tmp_path, stdout=str(tmp_path / "missing" / "out")))
    result = agent.finished("noout")
    assert result["exit_code"] is None
    assert result["reason"].startswith(f"cannot open output file {tmp_path}/missing/out: No such file")


def test_argv_env_and_paths_reach_the_job_byte_exact(agent, tmp_path):
    args = [
        "$HOME",
        "a b",
        "'single'",
        '"double"',
        "semi;colon|pipe&amp`tick`",
        "new\nline",
        "ünï©ødé ✓",
        "*",
        "",
        "\\",
        "\udcff raw byte",
    ]
    value = 'line1\nline2 ünï $X "q" \udcfe'
    out = tmp_path / "dïr with space"
    out.mkdir()
    code = (
        "import os\nopen(os.environ['OUT'], 'wb').write("
        "open('/proc/self/cmdline', 'rb').read() + b'\\x01' + os.environb[b'XV'])"
    )
    argv = py(code, *args)
    env = {"OUT": os.fsdecode(out / "got"), "XV": value}
    agent.launch(unit("exact", argv, tmp_path, env=env, cwd=str(out)))
    assert agent.finished("exact")["exit_code"] == 0
    cmdline, env_value = (out / "got").read_bytes().split(b"\x01")
    assert cmdline == b"".join(os.fsencode(a) + b"\0" for a in argv)
    assert env_value == os.fsencode(value)


def test_stderr_merged_into_stdout_when_none(agent, tmp_path):
    code = "import sys; print('to-out', flush=True); print('to-err', file=sys.stderr)"
    agent.launch(unit("merged", py(code), tmp_path))
    agent.finished("merged")
    assert (tmp_path / "merged.out").read_text() == "to-out\nto-err\n"


def test_separate_stdout_and_stderr_and_stdout_appends(agent, tmp_path):
    (tmp_path / "sep.out").write_text("before\n")
    code = "import sys; print('to-out'); print('to-err', file=sys.stderr)"
    agent.launch(unit("sep", py(code), tmp_path, stderr=str(tmp_path / "sep.err")))
    agent.finished("sep")
    assert (tmp_path / "sep.out").read_text() == "before\nto-out\n"
    assert (tmp_path / "sep.err").read_text() == "to-err\n"


def test_job_stdin_is_dev_null(agent, tmp_path):
    agent.launch(unit("stdin", py("import sys; print(repr(sys.stdin.read()))"), tmp_path))
    agent.finished("stdin")
    assert (tmp_path / "stdin.out").read_text() == "''\n"


# ---------------------------------------------------------------- limits and signals


def test_run_limit_kills_and_says_so(agent, tmp_path):
    agent.launch(unit("slow", ["sleep", "30"], tmp_path, run_limit=1))
    result = agent.finished("slow")
    assert result["reason"] == "run limit 00:00:01 reached"
    assert result["signal"] == signal.SIGTERM and result["exit_code"] is None
    assert result["end_time"] - result["start_time"] < 10


def test_run_limit_escalates_to_kill_after_grace(agent, tmp_path):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(30)"
    agent.launch(unit("stubborn", py(code), tmp_path, run_limit=1, grace=0.5))
    result = agent.finished("stubborn")
    assert result["reason"] == "run limit 00:00:01 reached" and result["signal"] == signal.SIGKILL


def test_memory_limit_kills_and_says_so(agent, tmp_path):
    code = "import time\nb = []\nfor _ in range(20):\n    b.append(b'x' * (10 << 20)); time.sleep(0.05)\ntime.sleep(30)"
    agent.launch(unit("hog", py(code), tmp_path, mem_limit=50 << 20))
    result = agent.finished("hog")
    assert result["reason"] == "memory limit 50M exceeded"
    assert result["signal"] == signal.SIGTERM


def test_signal_term_records_the_reason(agent, tmp_path):
    agent.launch(unit("victim", py(WAIT_JOB, str(tmp_path / "never")), tmp_path))
    job_pid(agent.spool, "victim")
    assert agent.request("signal", unit="victim", signal="TERM", reason="killed by alice")["found"]
    result = agent.finished("victim")
    assert result["reason"] == "killed by alice" and result["signal"] == signal.SIGTERM


def test_signal_kill_right_after_launch(agent, tmp_path):
    agent.launch(unit("quick", ["sleep", "30"], tmp_path))
    assert agent.request("signal", unit="quick", signal="KILL", reason="now")["found"]
    result = agent.finished("quick")
    assert result["reason"] == "now" and result["signal"] == signal.SIGKILL


def test_stop_and_cont_reach_the_job(agent, tmp_path):
    agent.launch(unit("pause", py(WAIT_JOB, str(tmp_path / "go")), tmp_path))
    pid = job_pid(agent.spool, "pause")
    assert agent.request("signal", unit="pause", signal="STOP", reason="")["found"]
    wait_until(lambda: proc_field(pid, 0) == "T", 5, "the job to be stopped")
    assert agent.request("signal", unit="pause", signal="CONT", reason="")["found"]
    wait_until(lambda: proc_field(pid, 0) != "T", 5, "the job to run again")
    (tmp_path / "go").touch()
    assert agent.finished("pause")["exit_code"] == 0


def test_usr1_is_forwarded_to_the_job(agent, tmp_path):
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: open(sys.argv[1] + '.got', 'w').close())\n"
        "open(sys.argv[1] + '.ready', 'w').close()\n"
        "end = time.time() + 30\n"
        "while time.time() < end: time.sleep(0.02)\n"
    )
    agent.launch(unit("usr", py(code, str(tmp_path / "usr1")), tmp_path))
    wait_until(lambda: (tmp_path / "usr1.ready").exists(), 10, "the job's USR1 handler")
    assert agent.request("signal", unit="usr", signal="USR1", reason="")["found"]
    wait_until(lambda: (tmp_path / "usr1.got").exists(), 10, "the job to catch USR1")
    agent.request("signal", unit="usr", signal="TERM", reason="done")
    assert agent.finished("usr")["reason"] == "done"


def test_signal_of_unknown_or_finished_unit_is_not_found(agent, tmp_path):
    assert agent.request("signal", unit="nobody", signal="TERM", reason="")["found"] is False
    agent.launch(unit("done", ["true"], tmp_path))
    agent.finished("done")
    assert agent.request("signal", unit="done", signal="TERM", reason="")["found"] is False
    assert not agent.request("signal", unit="done", signal="BOGUS", reason="")["ok"]
