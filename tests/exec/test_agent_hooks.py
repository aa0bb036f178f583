"""Hooks and the job starter in agent.py, on real test hosts: a systemd host (system units: the hooks are the unit's
`pre` and `post` steps, its ExecStartPre and ExecStopPost) and a plain host (the supervisor runs
them), each test on both.

Every hook appends one line to a log file: its point, layer, the job status and reason its env
says, and whether it sees a variable of the job's own env (a profile's hook must not). The order
and the count of the lines are the proof that each hook ran once, in order. Files live under
`testhosts_root`, which the hosts share with this machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agent_hosts import HOLD_JOB, PY, HostAgent, hook, lines, name, py, request, running, shared_dir
from tests.support.agent_local import AGENT
from tests.support.waiting import wait_until
from xce_lite.exec.host import HookRun, JobResult, LaunchRequested, Task, TaskFinished


def all_hooks(log: Path, **then: str) -> tuple[HookRun, ...]:
    """The hooks of a job's first host, in their order; `then` adds a command to a point's hook."""
    order = [("pre_host_exec", "profile"), ("pre_job_exec", "profile"), ("pre_job_exec", "job"),
             ("post_job_exec", "job"), ("post_job_exec", "profile"), ("post_host_exec", "profile")]
    return tuple(hook(point, log, layer=layer, then=then.get(f"{point}_{layer}", "")) for point, layer in order)


@pytest.fixture
def work(testhosts_root: Path) -> Path:
    return shared_dir(testhosts_root, "agent-hooks")


@pytest.fixture
def agent(kind, systemd_hosts, plain_hosts, work):
    """agent.py serving on the host of this kind, over ssh, as root."""
    host = systemd_hosts[0] if kind == "systemd" else plain_hosts[0]
    argv = [PY, "-S", "-E", str(AGENT), "serve", "--spool", str(work / "spool"), "--mode", kind]
    started = HostAgent(host.name, host.ssh_argv(argv), work / "agent.log")
    yield started
    started.close()
    assert "Traceback" not in (work / "agent.log").read_text(), "the agent failed: see its log"


def launch(agent: HostAgent, unit: str, argv: list[str], work: Path, hooks: tuple[HookRun, ...], **over) -> None:
    env = {"PATH": "/usr/bin:/bin", "JOB_ONLY": "job-env", "XCE_JOBID": "7"}
    [reply] = agent.launch([request(unit, argv, work, env=env, hooks=hooks, profile_env={"P": "1"}, **over)])
    assert reply.status == "started", reply


def test_the_hooks_run_once_each_in_order_around_the_job_with_their_env(agent, work):
    unit, log = name("order"), work / "hooks.log"
    launch(agent, unit, ["sh", "-c", f"echo job >> {log}; echo out"], work, all_hooks(log))
    result = agent.finished(unit)
    assert (result.exit_code, result.reason, result.note) == (0, None, None)
    assert lines(log) == [
        "pre_host_exec profile ||profile-env 7", "pre_job_exec profile ||profile-env 7",
        "pre_job_exec job ||job-env 7", "job",
        "post_job_exec job DONE||job-env 7", "post_job_exec profile DONE||profile-env 7",
        "post_host_exec profile DONE||profile-env 7",
    ]
    assert [(h["point"], h["layer"], h["ok"]) for h in result.hooks] == [
        ("pre_host_exec", "profile", True), ("pre_job_exec", "profile", True), ("pre_job_exec", "job", True),
        ("post_job_exec", "job", True), ("post_job_exec", "profile", True), ("post_host_exec", "profile", True)]
    out = (work / f"{unit}.out").read_text()
    assert out.count("[xce] ") == 12 and "[xce] pre_host_exec hook (profile) on " in out and "\nout\n" in out


def test_a_failing_pre_hook_ends_the_job_exit_and_the_post_hooks_still_run(agent, work):
    unit, log = name("prefail"), work / "hooks.log"
    launch(agent, unit, ["sh", "-c", f"echo job >> {log}"], work, all_hooks(log, pre_job_exec_profile="exit 3"))
    result = agent.finished(unit)
    assert result.reason == "pre_job_exec hook (profile) exited 3" and result.exit_code is None
    reason = "pre_job_exec hook (profile) exited 3"
    assert lines(log) == [
        "pre_host_exec profile ||profile-env 7", "pre_job_exec profile ||profile-env 7",
        f"post_job_exec job EXIT|{reason}|job-env 7", f"post_job_exec profile EXIT|{reason}|profile-env 7",
        f"post_host_exec profile EXIT|{reason}|profile-env 7",
    ]


@pytest.mark.parametrize("ending", ["exit", "kill", "run_limit"])
def test_the_post_hooks_see_how_the_job_ended(agent, work, ending):
    unit, log = name(ending), work / "hooks.log"
    argv = {"exit": ["sh", "-c", "exit 4"], "kill": py(HOLD_JOB, str(work / "never")),
            "run_limit": ["sleep", "30"]}[ending]
    launch(agent, unit, argv, work, all_hooks(log), run_limit=1 if ending == "run_limit" else None)
    if ending == "kill":
        running(work / "never")
        assert agent.signal(unit, "TERM", "killed by alice")
    result = agent.finished(unit)
    reason = {"exit": "", "kill": "killed by alice", "run_limit": "run limit 00:00:01 reached"}[ending]
    assert (result.reason or "") == reason
    assert [line.split("|")[0] for line in lines(log)[3:]] == [
        "post_job_exec job EXIT", "post_job_exec profile EXIT", "post_host_exec profile EXIT"]
    assert all(line.split("|")[1] == reason for line in lines(log)[3:])
    if ending == "exit":
        assert result.exit_code == 4


def test_a_hung_post_hook_is_stopped_at_its_timeout_and_recorded(agent, work):
    unit, log = name("hung"), work / "hooks.log"
    hooks = (hook("post_job_exec", log, then="sleep 60", timeout=1), hook("post_host_exec", log))
    launch(agent, unit, ["true"], work, hooks)
    result = agent.finished(unit, timeout=40)
    assert result.exit_code == 0 and result.reason is None  # DONE: post_failure is "record"
    assert result.note == "post_job_exec hook (profile) timed out after 1 s"
    assert [h["timed_out"] for h in result.hooks] == [True, False]
    assert [line.split()[0] for line in lines(log)] == ["post_job_exec", "post_host_exec"]


def test_post_failure_exit_makes_a_failing_post_hook_the_reason(agent, work):
    unit, log = name("strict"), work / "hooks.log"
    launch(agent, unit, ["true"], work, (hook("post_job_exec", log, then="exit 2"),), post_failure="exit")
    result = agent.finished(unit)
    assert (result.exit_code, result.reason, result.note) == (0, "post_job_exec hook (profile) exited 2", None)


def test_a_kill_while_a_pre_hook_runs_stops_it_the_job_never_runs_and_the_post_hooks_do(agent, work):
    unit, log = name("prekill"), work / "hooks.log"
    hooks = all_hooks(log, pre_job_exec_profile=f"touch {work}/in-pre; sleep 60")
    launch(agent, unit, ["sh", "-c", f"echo job >> {log}"], work, hooks)
    wait_until(lambda: (work / "in-pre").exists(), 30, "the pre hook to run")
    assert agent.signal(unit, "TERM", "killed by bob")
    result = agent.finished(unit)
    assert result.reason == "killed by bob" and result.exit_code is None
    assert [h["stopped"] for h in result.hooks[:2]] == [False, True]
    assert [line.split("|")[0] for line in lines(log)] == [
        "pre_host_exec profile ", "pre_job_exec profile ", "post_job_exec job EXIT", "post_job_exec profile EXIT",
        "post_host_exec profile EXIT"]


def test_a_hook_that_cannot_start_is_a_failure_with_its_reason(agent, work):
    unit = name("nohook")
    bad = HookRun("pre_host_exec", "profile", ("/no/such/hook",), 10)
    launch(agent, unit, ["true"], work, (bad,))
    result: JobResult = agent.finished(unit)
    assert result.reason == "pre_host_exec hook (profile) could not start: exec failed: No such file or directory: " \
                            "/no/such/hook"


def test_a_host_unit_runs_its_host_hooks_once(agent, work):
    unit, log = name("hosthooks"), work / "hooks.log"
    launch(agent, unit, [], work, (hook("pre_host_exec", log), hook("post_host_exec", log)), role="host")
    wait_until(lambda: len(lines(log)) == 1, 30, "the host's pre hook")
    assert agent.signal(unit, "TERM", "job 7 ended DONE")
    agent.finished(unit)
    assert lines(log) == ["pre_host_exec profile ||profile-env 7",
                          "post_host_exec profile |job 7 ended DONE|profile-env 7"]  # as the controller stops it


def test_the_job_starter_wraps_each_task_of_xce_launch_as_it_wraps_the_job(agent, work):
    unit = name("starter")
    starter = ["env", "STARTED_BY=starter"]
    task = "import os, sys\nprint('task', os.environ['XCE_TASK_INDEX'], os.environ.get('STARTED_BY'), flush=True)"
    argv = [*starter, "sh", "-c", 'xce launch -- "$@"; echo "launch exited $?"', "sh", PY, "-c", task]
    launch(agent, unit, argv, work, (), starter=tuple(starter))
    asked = agent.event(lambda e: isinstance(e, LaunchRequested) and e.unit == unit, "the launch request")
    assert asked.argv == (PY, "-c", task)  # as the job asked: the starter comes on the host, as for the job
    agent.tasks(unit, asked.launch_id, [Task(0, asked.argv, {**asked.env, "XCE_TASK_INDEX": "0"}, asked.cwd)])
    end = agent.event(lambda e: isinstance(e, TaskFinished) and e.launch_id == asked.launch_id, "the task's end")
    assert (end.exit_code, end.error) == (0, None)
    agent.launch_done(asked.launch_id, 0)
    assert agent.finished(unit).exit_code == 0
    assert "task 0 starter\n" in (work / f"{unit}.out").read_text()
