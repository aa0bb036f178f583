"""agent.py on real processes, driven through its raw JSON-lines protocol (no xce_lite client code).

Jobs are small Python programs run by this interpreter. Jobs that must stay running wait for a
"release" file (and give up by themselves after a minute), so nothing outlives a failed test.
The spool's journal is read here by journal(), written for the tests, not with agent.py's reader;
the few tests that need to look inside the agent (when it fdatasyncs) import agent.py in process.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import pwd
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.agent_local import AGENT, PY, WAIT_JOB, journal, journal_result, kill_leftovers
from tests.support.procs import proc_field
from tests.support.waiting import wait_until


class RawAgent:
    """`agent.py serve` as a child process; request() sends one line and returns its reply.

    `on_event`, if set, is called with each event as it is read, before it is listed in `events`.
    `prefix` goes before the command (e.g. strace), `pass_fds` are fds the agent inherits, `env` its
    environment. The agent runs in plain mode unless `extra` says --mode.
    """

    def __init__(self, spool: Path, *extra: str, prefix: tuple[str, ...] = (), pass_fds: tuple[int, ...] = (),
                 env: dict[str, str] | None = None):
        self.spool = spool
        self.stderr = open(spool.parent / "agent.stderr", "ab")
        self.on_event = None
        mode = () if "--mode" in extra else ("--mode", "plain")
        self.proc = subprocess.Popen(
            [*prefix, PY, "-S", "-E", str(AGENT), "serve", "--spool", str(spool), *mode, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            start_new_session=True,
            pass_fds=pass_fds,
            env=env,
        )
        self.replies: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        self.eof = threading.Event()
        self.next_id = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            msg = json.loads(line)
            if "id" in msg:
                self.replies.put(msg)
                continue
            if self.on_event is not None:
                self.on_event(msg)
            self.events.append(msg)
        self.eof.set()

    def request(self, op: str, **fields) -> dict:
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"id": self.next_id, "op": op, **fields}).encode() + b"\n")
        self.proc.stdin.flush()
        reply = self.replies.get(timeout=20)
        assert reply["id"] == self.next_id
        return reply

    def launch(self, *units: dict) -> list[dict]:
        reply = self.request("launch", units=list(units))
        assert reply["ok"], reply
        return reply["replies"]

    def finished(self, unit: str, timeout: float = 20) -> dict:
        """Wait for the `finished` event of `unit`; its result."""

        def find():
            return next((e["result"] for e in self.events if e["event"] == "finished" and e["unit"] == unit), None)

        return wait_until(find, timeout, f"the finished event of {unit}")

    def close(self) -> int:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.reader.join(10)
        self.proc.stdout.close()
        self.stderr.close()
        return code


def job_pid(spool: Path, unit: str) -> int:
    """The pid of the unit's job, once its supervisor has recorded it."""
    return wait_until(lambda: journal(spool).get(unit, {}).get("job"), 10, f"the job pid of {unit}")


def supervisor_pid(spool: Path, unit: str) -> int:
    """The pid of the unit's supervisor, once it has recorded itself."""
    return wait_until(lambda: journal(spool).get(unit, {}).get("pid"), 10, f"the supervisor pid of {unit}")


@pytest.fixture
def agents(spool):
    started: list[RawAgent] = []

    def start(*extra: str, **kw) -> RawAgent:
        started.append(RawAgent(spool, *extra, **kw))
        return started[-1]

    yield start
    for agent in started:
        agent.close()


@pytest.fixture
def agent(agents):
    return agents()


def unit(name: str, argv: list[str], tmp: Path, **over) -> dict:
    spec = {
        "unit": name,
        "argv": argv,
        "env": {"PATH": os.environ["PATH"]},
        "cwd": str(tmp),
        "stdout": str(tmp / f"{name}.out"),
        "stderr": None,
        "run_limit": None,
        "mem_limit": None,
        "grace": 2,
    }
    spec.update(over)
    return spec


def py(code: str, *args: str) -> list[str]:
    return [PY, "-c", code, *args]


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
    assert list((spool / "units").iterdir()) == []
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
    agent.append(agent_py.record("launched", unit="x", start_time=1.0))
    result = {"exit_code": 0, "signal": None, "start_time": 1.0, "end_time": 2.0, "cpu_time": 0, "max_rss": 0}
    agent_py.append_shared(agent.journal_path, agent_py.record("finished", unit="x", result=result), sync=False)
    synced = []
    monkeypatch.setattr(agent_py.os, "fdatasync", synced.append)
    monkeypatch.setattr(agent_py.os, "write", lambda fd, data: synced.append(("write", fd)) or len(data))
    assert agent.op_list({})["units"][0]["result"] == result
    agent.out.append(b"the reply\n")
    agent.flush()
    assert synced == [agent.jfd, ("write", 1)]
    agent.reported("x", result)  # now known durable: no second sync
    agent.flush()
    assert synced == [agent.jfd, ("write", 1)]
    os.close(agent.jfd)


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
        os.close(Agent(str(spool), "h").jfd)
        assert synced_dirs == [str(spool), str(tmp_path)]


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
