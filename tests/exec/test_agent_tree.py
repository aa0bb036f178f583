"""The plain supervisor owns its job's whole process tree, on a plain test host (no systemd: PID 1
there is `sleep infinity`, which reaps nothing) and on this machine, the agent in plain mode.

The job starts a background child (`sleep 1000 &`, in its own process group) and a child in a
session of its own (`setsid`), writes their pids, and then ends by itself or is killed. Both must
be gone (not even zombies) once the unit's result is out, the result's note must count the
leftovers, and the post hook, which runs once the tree is gone, must see them gone, once.
Files live under `testhosts_root`, which the hosts share with this machine.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.agent_hosts import PY, HostAgent, host_proc_state, in_host, name, request
from tests.support.agent_local import journal
from tests.support.procs import proc_field
from tests.support.waiting import wait_until
from xce_lite.exec.bundle import local_file
from xce_lite.exec.host import HookRun

# the job: a background child and a setsid child, their pids in files, then `then`
JOB = ("sleep 1000 & echo $! > {w}/bg; setsid sh -c 'echo $$ > {w}/sid.tmp; mv {w}/sid.tmp {w}/sid; exec sleep 1000' &"
       " while [ ! -s {w}/sid ]; do sleep 0.02; done; {then}")
# the post hook: whether each of those pids still names a process (a zombie would count: kill -0 succeeds)
POST = 'for p in $(cat {w}/bg {w}/sid); do if kill -0 "$p" 2>/dev/null; then echo alive; else echo gone; fi; done' \
       ' >> {w}/post.log'


@pytest.fixture(params=["plain-host", "local"])
def where(request, testhosts_root):
    """(the agent, a function: the state letter of this pid of the agent's host, None if it names no
    process, the work directory, a function that kills a pid of the agent's host)."""
    work = testhosts_root / "agent-tree" / uuid.uuid4().hex[:8]
    work.mkdir(parents=True)
    if request.param == "plain-host":
        host = request.getfixturevalue("plain_hosts")[0]
        argv = host.ssh_argv([PY, "-S", "-E", str(local_file()), "serve", "--spool", str(work / "spool"),
                              "--mode", "plain"])

        def state(pid: int) -> str | None:
            return host_proc_state(host, pid)

        def kill(pid: int) -> None:
            in_host(host, "kill", "-9", str(pid))
    else:
        argv = [sys.executable, "-S", "-E", str(local_file()), "serve", "--spool", str(work / "spool"),
                "--mode", "plain"]

        def state(pid: int) -> str | None:
            return proc_field(pid, 0)

        def kill(pid: int) -> None:
            os.kill(pid, signal.SIGKILL)
    agent = HostAgent(request.param, argv, work / "agent.log")
    yield agent, state, work, kill
    agent.close()
    for f in ("bg", "sid"):  # nothing of a failed test runs on
        if (work / f).exists() and state(pid := int((work / f).read_text())) is not None:
            kill(pid)
    assert "Traceback" not in (work / "agent.log").read_text(), "the agent failed: see its log"


def launch(agent: HostAgent, work: Path, then: str) -> str:
    unit = name("tree")
    hook = HookRun("post_job_exec", "profile", ("/bin/sh", "-c", POST.format(w=work)), 20.0)
    req = request(unit, ["/bin/sh", "-c", JOB.format(w=work, then=then)], work, hooks=(hook,), profile_env={},
                  grace=1.0)
    [reply] = agent.launch([req])
    assert reply.status == "started", reply
    return unit


def pids(work: Path) -> list[int]:
    return [int((work / f).read_text()) for f in ("bg", "sid")]


def test_a_job_that_ends_leaves_nothing_running_and_says_what_it_killed(where):
    agent, state, work, _ = where
    unit = launch(agent, work, "exit 0")
    result = agent.finished(unit)
    assert (result.exit_code, result.signal, result.reason) == (0, None, None)  # DONE, whatever it left
    assert result.note == "2 leftover processes killed"
    assert [state(pid) for pid in pids(work)] == [None, None]  # killed and reaped
    assert (work / "post.log").read_text().split() == ["gone", "gone"]  # after the tree, once


def test_a_killed_job_takes_its_setsid_child_with_it(where):
    agent, state, work, _ = where
    unit = launch(agent, work, f"touch {work}/ready; sleep 1000")
    wait_until(lambda: (work / "ready").exists(), 30, "the job to have started its children")
    assert None not in [state(pid) for pid in pids(work)]
    assert agent.signal(unit, "TERM", "killed by alice")
    result = agent.finished(unit)
    assert result.reason == "killed by alice"
    # the background child is in the job's group and went with the kill; the setsid one is a leftover
    assert result.note == "1 leftover process killed"
    assert [state(pid) for pid in pids(work)] == [None, None]  # killed and reaped
    assert (work / "post.log").read_text().split() == ["gone", "gone"]


def test_a_killed_supervisor_takes_its_whole_session_with_it(where):
    """kill -9 of the supervisor itself: the agent records the unit lost and kills what the job left
    in the supervisor's session, in whatever process group (here one the job's child made itself)."""
    agent, state, work, kill = where
    unit = name("lost")
    own_group = f"{PY} -c 'import os, time; os.setpgid(0, 0); open(\"{work}/grouped\", \"w\"); time.sleep(1000)'"
    job = (f"{own_group} & echo $! > {work}/bg; while [ ! -e {work}/grouped ]; do sleep 0.02; done; "
           f"touch {work}/ready; sleep 1000")
    [reply] = agent.launch([request(unit, ["/bin/sh", "-c", job], work, grace=1.0)])
    assert reply.status == "started", reply
    wait_until(lambda: (work / "ready").exists(), 30, "the job to have started its child")
    bg = int((work / "bg").read_text())
    wait_until(lambda: journal(work / "spool").get(unit, {}).get("pid"), 10, "the supervisor's pid")
    kill(journal(work / "spool")[unit]["pid"])
    result = agent.finished(unit)
    assert result.reason.startswith("supervisor lost: ")
    assert result.reason.endswith("; its remaining processes were killed")
    # killed: then reaped by PID 1, or a zombie where PID 1 reaps nothing (a plain test host's `sleep`)
    wait_until(lambda: state(bg) in (None, "Z"), 10, "the child in a group of its own to be killed")


def test_the_memory_limit_counts_a_setsid_child_and_takes_it_with_the_job(where):
    """A child in a session of its own that eats the memory: the plain supervisor's sample counts
    every descendant (it once counted the job's process groups only), the limit ends the job, and
    the child goes with it."""
    agent, state, work, _ = where
    unit = name("hog")
    hog = f"{PY} -c 'import os, time; os.write(1, str(os.getpid()).encode()); b = bytearray(200 << 20); time.sleep(60)'"
    job = f"setsid {hog} > {work}/hog & sleep 60"
    [reply] = agent.launch([request(unit, ["/bin/sh", "-c", job], work, grace=1.0, mem_limit=100 << 20)])
    assert reply.status == "started", reply
    result = agent.finished(unit)
    assert result.reason == "memory limit 100M exceeded"
    assert result.note == "1 leftover process killed"
    assert state(int((work / "hog").read_text())) is None
