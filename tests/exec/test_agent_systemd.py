"""The host agent inside real systemd test hosts: jobs in system units, as root over ssh (user units:
test_agent_user_units.py), as the unit's own main process ("direct" units, the rule) or under the
Python supervisor (host units, jobs whose bytes D-Bus cannot carry, memory limits systemd cannot
enforce).

The agent runs inside the host (`ssh host1 python3 agent.py serve ...`), its pipes wrapped in an
AgentChannel, and the tests speak to it through AgentOps, as the controller does. Spools, job
directories and outputs live under `testhosts_root`, which the hosts share with this machine; unit
names carry a random prefix, since the hosts outlive a test. Jobs that must stay running (HOLD_JOB)
say so in a file, with their pid, then wait for a "release" file (and give up after a minute by
themselves).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from tests.support.agent_local import AGENT, WAIT_JOB, journal, recorded_result
from tests.support.agent_hosts import (
    HOLD_JOB,
    PY,
    HostAgent,
    host_proc_state,
    in_host,
    name,
    py,
    request,
    running,
    shared_dir,
    stop_leftovers,
)
from tests.support.waiting import wait_until
from xce_lite.errors import HostUnreachable, LaunchRejected
from xce_lite.exec.host import (
    LaunchRequested,
    Task,
    TaskFinished,
)

SUPERVISED = {"NOT.DIRECT": "1"}  # an env name systemd refuses: the job runs under the supervisor
TASK = (
    "import os, sys\ni = int(os.environ['XCE_TASK_INDEX'])\n"
    "cgroup = [line for line in open('/proc/self/cgroup') if line.startswith('0::')][0].strip()\n"
    "print(f'task {i} in {cgroup}', flush=True)\nsys.exit(3 + i)\n"
)


def launched(spool: Path, unit: str) -> dict:
    """The unit's last `launched` record in the journal (its "direct" says how it runs)."""
    records = [json.loads(line) for line in (spool / "journal").read_bytes().split(b"\n") if line.strip()]
    return [r for r in records if r.get("event") == "launched" and r.get("unit") == unit][-1]


@pytest.fixture
def work(testhosts_root: Path) -> Path:
    """This test's directory (the host sees it at the same path): spool, job cwd and outputs."""
    return shared_dir(testhosts_root, "agent-systemd")


@pytest.fixture
def root_agents(systemd_hosts, work):
    """start(spool=work/spool, mode="systemd", *extra) -> a HostAgent serving on host1, as root, over ssh."""
    host, started, spools = systemd_hosts[0], [], set()

    def start(spool: Path | None = None, mode: str = "systemd", *extra: str) -> HostAgent:
        spool = spool or work / "spool"
        spools.add(spool)
        argv = [PY, "-S", "-E", str(AGENT), "serve", "--spool", str(spool), "--mode", mode, "--host-name", host.name,
                *extra]
        started.append(HostAgent(host.name, host.ssh_argv(argv), work / "agent.log"))
        return started[-1]

    yield start
    for spool in spools:
        stop_leftovers(host, spool, None)
    for agent in started:
        agent.close()
    assert "Traceback" not in (work / "agent.log").read_text(), "the agent failed: see its log"


# ---------------------------------------------------------------- system units (root)


def test_hello_says_the_host_runs_system_units(root_agents):
    x = root_agents().hello.extra
    assert x["mode"] == "systemd"
    assert x["modes"]["systemd"] == {"ok": True, "why": None, "memory": "systemd", "direct": True}
    assert x["systemd"] and x["cgroup"] in ("v1", "v2", "hybrid") and (x["user"], x["uid"]) == ("root", 0)
    assert not x["modes"]["user"]["ok"] and "root" in x["modes"]["user"]["why"]


def test_a_job_runs_in_a_system_unit_of_its_own_and_its_result_comes_back(root_agents, work):
    agent, unit = root_agents(), name("cg")
    [reply] = agent.launch([request(unit, py("print(open('/proc/self/cgroup').read()); raise SystemExit(3)"), work)])
    assert reply.status == "started"
    result = agent.finished(unit)
    assert (result.exit_code, result.signal, result.reason) == (3, None, None)
    assert (result.service_result, result.mode) == ("exit-code", "systemd")  # systemd's own verdict on the job
    assert result.cpu_time > 0 and result.max_rss > 0  # the unit's cgroup's
    assert f"/system.slice/{unit}.service\n" in (work / f"{unit}.out").read_text()
    assert not (work / "spool" / "units" / unit).exists()  # removed once the result was durable
    assert launched(work / "spool", unit)["direct"] == {"stdout": f"{work}/{unit}.out", "stderr": None, "grace": 2.0}


def test_the_run_limit_is_systemds_and_says_so(root_agents, work):
    agent, unit = root_agents(), name("slow")
    agent.launch([request(unit, ["sleep", "30"], work, run_limit=1)])
    result = agent.finished(unit)
    assert result.reason == "run limit 00:00:01 reached" and result.service_result == "timeout"
    assert result.signal == signal.SIGTERM


def test_the_memory_limit_is_systemds_and_says_so(root_agents, work):
    agent, unit = root_agents(), name("fat")
    code = "import time\nx = bytearray(200 << 20)\ntime.sleep(10)"
    agent.launch([request(unit, py(code), work, mem_limit=64 << 20)])
    result = agent.finished(unit)
    assert result.reason == "memory limit 64M exceeded" and result.exit_code is None


def test_a_kill_ends_the_job_with_its_reason(root_agents, work):
    agent, unit = root_agents(), name("victim")
    agent.launch([request(unit, py(HOLD_JOB, str(work / "never")), work)])
    running(work / "never")
    assert agent.signal(unit, "TERM", "killed by alice")
    result = agent.finished(unit)
    assert (result.reason, result.signal, result.service_result) == ("killed by alice", signal.SIGTERM, "success")


def test_a_kill_right_after_launch_is_held_until_the_supervisor_runs(root_agents, work):
    agent, unit = root_agents(), name("early")
    agent.launch([request(unit, py(WAIT_JOB, str(work / "never")), work)])
    assert agent.signal(unit, "KILL", "killed by bob")  # systemd may not even have started it yet
    result = agent.finished(unit)
    assert result.reason == "killed by bob" and result.exit_code is None


def test_suspend_and_resume_reach_the_job(root_agents, systemd_hosts, work):
    agent, unit, host = root_agents(), name("nap"), systemd_hosts[0]
    agent.launch([request(unit, py(HOLD_JOB, str(work / "go")), work)])
    job = running(work / "go")
    assert agent.signal(unit, "STOP", "suspended by alice")
    wait_until(lambda: host_proc_state(host, job) == "T", 10, "the job stopped")
    assert agent.signal(unit, "CONT", "resumed by alice")
    wait_until(lambda: host_proc_state(host, job) in ("S", "R"), 10, "the job running again")
    (work / "go").touch()
    assert agent.finished(unit).exit_code == 0


def test_an_agent_killed_and_started_again_adopts_running_units_and_reports_finished_ones(
    root_agents, systemd_hosts, work
):
    first, early, late = root_agents(), name("early"), name("late")
    first.launch([request(early, py(HOLD_JOB, str(work / "go-early"), "3"), work),
                  request(late, py(HOLD_JOB, str(work / "go-late"), "4"), work)])
    for release in ("go-early", "go-late"):
        running(work / release)
    in_host(systemd_hosts[0], "kill", "-9", str(first.hello.extra["pid"]))
    (work / "go-early").touch()
    wait_until(lambda: recorded_result(work / "spool", early), 20, "early's result, written with no agent")
    second = root_agents()
    listed = {u.unit: u for u in second.list_units()}
    assert listed[early].status == "finished" and listed[early].result.exit_code == 3
    assert listed[late].status == "running"
    assert second.launch([request(late, ["true"], work)])[0].status == "running"  # adopted, not run again
    (work / "go-late").touch()
    result = second.finished(late)
    assert result.exit_code == 4 and result.service_result == "exit-code"


def test_a_repeated_launch_never_runs_a_unit_twice(root_agents, work):
    agent, unit, counter = root_agents(), name("once"), work / "counter"
    argv = py(f"open({str(counter)!r}, 'a').write('ran\\n')\n" + WAIT_JOB, str(work / "go"))
    replies = agent.launch([request(unit, argv, work), request(unit, argv, work)])
    assert [r.status for r in replies] == ["started", "running"]
    assert agent.launch([request(unit, argv, work)])[0].status == "running"
    (work / "go").touch()
    first = agent.finished(unit)
    [again] = agent.launch([request(unit, argv, work)])
    assert again.status == "finished" and agent.list_units()[0].result == first
    assert counter.read_text() == "ran\n"


def test_a_unit_systemd_refuses_is_the_units_result(root_agents, systemd_hosts, work):
    agent, unit, host = root_agents(), name("taken"), systemd_hosts[0]
    in_host(host, "systemd-run", f"--unit={unit}.service", "--quiet", "--collect", "sleep", "60")  # not ours
    try:
        [reply] = agent.launch([request(unit, ["true"], work)])
        assert reply.status == "started"
        result = agent.finished(unit)
        assert result.reason.startswith("systemd refused the unit: ") and unit in result.reason
        assert result.exit_code is None and not (work / "spool" / "units" / unit).exists()
    finally:
        in_host(host, "systemctl", "stop", f"{unit}.service")


def test_a_supervisor_killed_9_still_gets_its_result_from_post(root_agents, systemd_hosts, work):
    agent, unit = root_agents(), name("orphan")
    agent.launch([request(unit, py(WAIT_JOB, str(work / "never")), work, env={"PATH": "/usr/bin:/bin", **SUPERVISED})])
    supervisor = wait_until(lambda: journal(work / "spool").get(unit, {}).get("pid"), 20, f"{unit}'s supervisor")
    assert "direct" not in launched(work / "spool", unit)
    in_host(systemd_hosts[0], "kill", "-9", str(supervisor))
    result = agent.finished(unit)
    assert result.exit_code is None and result.service_result == "signal"
    assert result.reason.startswith("supervisor lost: it ended without a result (signal: killed KILL)")


def test_a_direct_job_killed_9_is_recorded_by_its_exec_stop_post(root_agents, systemd_hosts, work):
    agent, unit = root_agents(), name("shot")
    agent.launch([request(unit, py(HOLD_JOB, str(work / "never")), work)])
    in_host(systemd_hosts[0], "kill", "-9", str(running(work / "never")))
    result = agent.finished(unit)
    assert (result.exit_code, result.signal, result.service_result) == (None, signal.SIGKILL, "signal")
    assert result.reason == "killed by signal SIGKILL"


def test_a_direct_job_that_cannot_start_says_why_as_the_supervisor_does(root_agents, work):
    agent, missing, closed = root_agents(), name("missing"), name("closed")
    agent.launch([request(missing, ["no-such-command-xyz"], work),
                  request(closed, ["true"], work, stdout=f"{work}/no/such/dir/out")])
    result = agent.finished(missing)
    assert (result.exit_code, result.reason) == (127, "exec failed: No such file or directory: no-such-command-xyz")
    assert agent.finished(closed).reason.startswith(f"cannot open output file {work}/no/such/dir/out: No such file")


def test_a_host_unit_holds_until_it_is_killed(root_agents, work):
    agent, unit = root_agents(), name("hold")
    [reply] = agent.launch([request(unit, [], work, role="host")])
    assert reply.status == "started"
    wait_until(lambda: journal(work / "spool").get(unit, {}).get("pid"), 20, f"{unit} started")
    assert journal(work / "spool")[unit]["job"] == 0 and agent.list_units()[0].status == "running"
    assert agent.signal(unit, "TERM", "job 9 ended")
    result = agent.finished(unit)
    assert (result.exit_code, result.reason) == (0, "job 9 ended")


def test_the_job_gets_its_hostfile_and_env(root_agents, work):
    agent, unit = root_agents(), name("env")
    spool = work / "spool"
    code = (
        "import json, os\nd = os.environ['XCE_JOB_HOST_DIR']\n"
        "print(json.dumps({'env': {k: v for k, v in os.environ.items() if k.startswith('XCE_') or k in ('PATH', 'A')},"
        " 'hostfile': open(os.environ['XCE_HOSTFILE']).read(), 'dir': sorted(os.listdir(d))}))"
    )
    agent.launch([request(unit, py(code), work, env={"PATH": "/usr/bin:/bin", "A": "$HOME %n"}, hostfile="host1\n")])
    assert agent.finished(unit).exit_code == 0
    got, host_dir = json.loads((work / f"{unit}.out").read_text()), spool / "units" / unit
    assert got["env"] == {
        "PATH": f"/usr/bin:/bin:{spool}/bin", "A": "$HOME %n", "XCE_UNIT": unit, "XCE_JOB_HOST_DIR": str(host_dir),
        "XCE_LAUNCH_SOCKET": str(spool / "agent.sock"), "XCE_HOSTFILE": str(host_dir / "hostfile"),
    }
    # a direct unit has no spec.json: its argv and env are in job-env.sh (0600), never on the unit
    assert got["hostfile"] == "host1\n" and got["dir"] == ["hostfile", "job-env.sh"]


def test_xce_launch_runs_tasks_inside_the_unit_with_their_exit_codes(root_agents, work):
    agent, unit = root_agents(), name("par")
    argv = ["sh", "-c", 'xce launch -- "$@"; echo "launch exited $?"', "sh", PY, "-c", TASK]
    agent.launch([request(unit, argv, work)])
    asked = agent.event(lambda e: isinstance(e, LaunchRequested) and e.unit == unit, "the launch request")
    assert asked.argv == (PY, "-c", TASK) and asked.cwd == str(work)
    tasks = [Task(i, asked.argv, {**asked.env, "XCE_TASK_INDEX": str(i)}, asked.cwd) for i in (0, 1)]
    agent.tasks(unit, asked.launch_id, tasks)
    ends = [
        agent.event(lambda e, i=i: isinstance(e, TaskFinished) and e.launch_id == asked.launch_id and e.index == i,
                    f"task {i} finished")
        for i in (0, 1)
    ]
    assert [(e.exit_code, e.signal, e.error) for e in ends] == [(3, None, None), (4, None, None)]
    assert agent.launch_done(asked.launch_id, 7)
    assert agent.finished(unit).exit_code == 0
    out = (work / f"{unit}.out").read_text()
    assert f"task 0 in 0::/system.slice/{unit}.service\n" in out and f"task 1 in 0::/system.slice/{unit}.service" in out
    assert out.endswith("launch exited 7\n")
    with pytest.raises(LaunchRejected, match="is not running on this host"):
        agent.tasks(unit, asked.launch_id, tasks)


def test_a_direct_unit_is_delegated_with_no_controller_of_its_own(root_agents, systemd_hosts, work):
    # Delegation (which AttachProcessesToUnit needs: the test above) with every controller doubled
    # the manager's CPU per unit (bench/agent_systemd.py); the unit's limits come from its own
    # properties (MemoryMax: test_the_memory_limit_is_systemds_and_says_so), not from delegation.
    agent, unit = root_agents(), name("deleg")
    agent.launch([request(unit, py(HOLD_JOB, str(work / "go-deleg")), work)])
    running(work / "go-deleg")
    shown = in_host(systemd_hosts[0], "systemctl", "show", "-p", "Delegate", "-p", "DelegateControllers",
                    "-p", "MemoryAccounting", f"{unit}.service")
    assert sorted(shown.split()) == ["Delegate=yes", "DelegateControllers=", "MemoryAccounting=yes"]
    (work / "go-deleg").touch()
    result = agent.finished(unit)
    assert result.exit_code == 0 and result.max_rss > 0 and result.cpu_time > 0


@pytest.mark.parametrize("raw", ["", "\udcff"], ids=["direct", "raw-bytes-supervised"])
def test_argv_and_env_reach_the_job_byte_exact_past_systemd(root_agents, systemd_hosts, work, raw):
    agent, unit = root_agents(), name("exact")
    args = ["$HOME", "${PATH}", "%n %i %%", "a b", "'single'", '"double"', "$(touch /pwned)", "semi;colon|pipe&",
            ";", "new\nline", "ünï©ødé ✓", "*", "", "\\", "\\$X", "$", "-e", "\t tab", f"{raw} raw byte"]
    value = f'line1\nline2 ünï $X ${{Y}} %h "q" \\; {raw}'
    code = ("import os, time\nopen(os.environ['OUT'] + '.running', 'w').write('1')\n"
            "while not os.path.exists(os.environ['GO']):\n    time.sleep(0.02)\n"
            "open(os.environ['OUT'], 'wb').write(\n"
            "    open('/proc/self/cmdline', 'rb').read() + b'\\x01' + os.environb[b'XV'])")
    argv = py(code, *args)
    env = {"OUT": str(work / "got"), "GO": str(work / "go"), "XV": value}
    agent.launch([request(unit, argv, work, env=env)])
    assert ("direct" in launched(work / "spool", unit)) == (not raw)
    running(work / "got")
    in_host(systemd_hosts[0], "systemctl", "daemon-reload")  # re-reads the unit: its ExecStopPost must survive
    (work / "go").touch()
    assert agent.finished(unit).exit_code == 0
    cmdline, env_value = (work / "got").read_bytes().split(b"\x01")
    assert cmdline == b"".join(os.fsencode(a) + b"\0" for a in argv)
    assert env_value == os.fsencode(value)


def test_jobs_see_the_hosts_tmp_and_this_machines_tmp_is_untouched(root_agents, work):
    agent, unit = root_agents(), name("tmp")
    probe = f"/tmp/xce-agent-probe-{uuid.uuid4().hex}"
    agent.launch([request(unit, ["sh", "-c", f"touch {probe} && test -e {probe}"], work)])
    assert agent.finished(unit).exit_code == 0
    assert not os.path.exists(probe)


def test_many_units_at_once_all_start_and_finish_while_the_journal_is_compacted(root_agents, work):
    agent = root_agents(None, "systemd", "--journal-limit", "4096")
    os.link(work / "spool" / "journal", work / "first-journal")  # so that no new file gets its inode number
    first_journal = (work / "first-journal").stat().st_ino
    units = [name(f"m{i}") for i in range(30)]
    replies = agent.launch([request(unit, ["true"], work) for unit in units])
    assert {r.status for r in replies} == {"started"}
    assert all(agent.finished(unit, timeout=60).exit_code == 0 for unit in units)
    assert list((work / "spool" / "units").iterdir()) == []
    assert (work / "spool" / "journal").stat().st_ino != first_journal  # compacted meanwhile
    assert all(journal(work / "spool")[u]["result"]["exit_code"] == 0 for u in units)


def test_an_agent_that_exits_first_starts_the_units_it_queued(root_agents, work):
    agent, units = root_agents(), [name(f"q{i}") for i in range(12)]
    agent.launch([request(unit, ["true"], work) for unit in units])
    agent.close()  # at once: most are still queued for systemd-run
    results = wait_until(lambda: all(results := [recorded_result(work / "spool", u) for u in units]) and results,
                         60, "every queued unit's result")
    assert {u: r["exit_code"] for u, r in zip(units, results)} == dict.fromkeys(units, 0)


def test_a_spool_path_systemd_would_split_falls_back_to_plain_or_is_fatal(root_agents, work):
    spool = work / "with space" / "spool"
    agent = root_agents(spool, "auto")
    why = agent.hello.extra["modes"]["systemd"]["why"]
    assert agent.hello.extra["mode"] == "plain" and "' '" in why and "systemd would split or expand" in why
    agent.close()
    with pytest.raises(HostUnreachable, match="cannot run units in mode systemd.*systemd would split"):
        root_agents(spool, "systemd")


def test_a_unit_name_systemd_cannot_take_is_refused(root_agents, work):
    [reply] = root_agents().launch([request("a+b=c", ["true"], work)])
    assert reply.status == "refused" and "cannot name a systemd unit" in reply.error


def test_read_and_ping_through_the_host_seam(root_agents, work):
    agent, unit = root_agents(), name("peek")
    agent.launch([request(unit, ["sh", "-c", "printf 'line 1\\nline 2\\n'"], work)])
    agent.finished(unit)
    chunk = agent.read(str(work / f"{unit}.out"), offset=7)
    assert (chunk.data, chunk.offset, chunk.size, chunk.eof) == (b"line 2\n", 14, 14, True)
    with pytest.raises(LaunchRejected, match="No such file"):
        agent.read(str(work / "missing.out"))
    assert agent.ping() > 0
