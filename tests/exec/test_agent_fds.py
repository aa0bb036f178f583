"""The plain agent's fds (exec/agent/fds.py, zygote.py, pool.py) on real processes: an agent out
of fds while it launches a batch of poolable jobs starts them all (fresh supervisors stand in for
the workers it cannot make sockets for) and keeps its zygote; a worker killed while idle, after a
batch whose fresh supervisor was forked while that worker's socket was in the zygote's hands, is
seen gone and takes no job; the agent raises its soft fd limit, its jobs keep the one it was
started with, before and after its zygote is killed -9."""

from __future__ import annotations

import os
import resource
import signal
import sys

from tests.support.agent_local import WAIT_JOB, children, finished, journal, zygote_of
from tests.support.procs import proc_field
from tests.support.waiting import wait_until
from xce_lite.exec.host import JobUser, LaunchRequest

NOFILE = resource.RLIMIT_NOFILE


def quick(tmp_path, unit: str, code: int = 0) -> LaunchRequest:
    """A unit that exits with `code` at once (its go file is there already)."""
    (tmp_path / f"go-{unit}").touch()
    argv = (sys.executable, "-c", WAIT_JOB, str(tmp_path / f"go-{unit}"), str(code))
    return LaunchRequest(unit=unit, argv=argv, env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path),
                         stdout=str(tmp_path / f"{unit}.out"), stderr=None)


def gone(pid: int) -> bool:
    return proc_field(pid, 0) in (None, "Z")


RECVMSG = {"x86_64": 47, "aarch64": 212}  # the syscall an idle worker waits in (receive_job)


def syscall_of(pid: int) -> int | None:
    """The number of the syscall `pid` is blocked in (/proc/PID/syscall)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            first = f.read().split()[0]
    except (OSError, IndexError):
        return None
    return int(first) if first.isdigit() else None


def test_an_agent_out_of_fds_starts_a_batch_of_poolable_jobs_and_keeps_its_zygote(hosts, spool, tmp_path):
    host, events = hosts(mode="plain")
    zygote = zygote_of(host)
    host.launch([quick(tmp_path, "warm")])  # the journal and whatever else the agent keeps open are open now
    assert finished(events, "warm")["warm"].result.exit_code == 0
    # a few fds left: the first new workers' sockets are made, then socketpair fails (EMFILE)
    fds = len(os.listdir(f"/proc/{host.agent_pid}/fd"))
    old = resource.prlimit(host.agent_pid, NOFILE)
    resource.prlimit(host.agent_pid, NOFILE, (fds + 3, old[1]))
    try:
        # the first takes the idle worker; the next ones need new workers, more than there are fds
        units = [f"j{i}" for i in range(12)]
        replies = host.launch([quick(tmp_path, unit, 10 + i) for i, unit in enumerate(units)])
    finally:
        resource.prlimit(host.agent_pid, NOFILE, old)
    assert [r.status for r in replies] == ["started"] * len(units), [r.error for r in replies]
    got = finished(events, *units)
    for i, unit in enumerate(units):  # each ran, once: none is "supervisor lost"
        assert (got[unit].result.exit_code, got[unit].result.reason) == (10 + i, None), got[unit].result
    assert not gone(zygote) and zygote in children(host.agent_pid)  # the zygote was not taken for lost
    # some ran in fresh supervisors (no socket for their worker), which have exited; the workers are idle
    pids = [journal(spool)[unit]["pid"] for unit in units]
    wait_until(lambda: any(gone(pid) for pid in pids), 10, "the fresh supervisors to exit")
    assert not gone(pids[0])  # the warm worker, idle again
    # then the zygote is killed -9, and the next batch runs (a new zygote, new workers)
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: gone(zygote), 10, "the killed zygote to be reaped")
    again = [f"k{i}" for i in range(4)]
    replies = host.launch([quick(tmp_path, unit, 20 + i) for i, unit in enumerate(again)])
    assert [r.status for r in replies] == ["started"] * len(again)
    got = finished(events, *again)
    assert [got[unit].result.exit_code for unit in again] == [20, 21, 22, 23]


def test_a_worker_killed_idle_after_a_fresh_supervisor_was_forked_in_its_batch_takes_no_job(hosts, spool, tmp_path):
    host, events = hosts(mode="plain")
    # one batch: a unit that is not poolable (run as root with another group: a fresh supervisor),
    # which hangs opening its output (a FIFO with no reader, as on a hung file server), then a
    # poolable one that needs a new worker, whose socket came to the zygote with that same request
    fifo = tmp_path / "holder.out"
    os.mkfifo(fifo)
    holder = LaunchRequest(unit="holder", argv=("true",), env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path),
                           stdout=str(fifo), stderr=None, user=JobUser(name="root", uid=0, gid=1))
    replies = host.launch([holder, quick(tmp_path, "first", 3)])
    assert [r.status for r in replies] == ["started", "started"], [r.error for r in replies]
    assert finished(events, "first")["first"].result.exit_code == 3
    worker = journal(spool)["first"]["pid"]
    # idle: waiting for its next job (recvmsg), not for its release (recv)
    wait_until(lambda: syscall_of(worker) == RECVMSG[os.uname().machine], 10, "the worker to be idle")
    # the idle worker is killed -9 (the OOM killer, an admin): the agent must not hand it the next job
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: gone(worker), 10, "the killed worker to be reaped")
    host.launch([quick(tmp_path, "next", 5)])
    assert finished(events, "next", timeout=20)["next"].result.exit_code == 5
    assert journal(spool)["next"]["pid"] != worker
    # and a job runs in a reused worker again
    host.launch([quick(tmp_path, "after", 6)])
    assert finished(events, "after")["after"].result.exit_code == 6
    assert journal(spool)["after"]["pid"] == journal(spool)["next"]["pid"]
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the holder's output opens: it runs and ends
    try:
        assert finished(events, "holder")["holder"].result.exit_code == 0
    finally:
        os.close(reader)


LIMIT_JOB = "import resource; print(*resource.getrlimit(resource.RLIMIT_NOFILE))"


def test_the_agent_raises_its_fd_limit_and_its_jobs_keep_the_one_it_was_started_with(hosts, spool, tmp_path):
    old = resource.getrlimit(NOFILE)
    hard = old[1]
    resource.setrlimit(NOFILE, (min(512, hard), hard))  # the agent starts with a soft limit below its hard one
    try:
        host, events = hosts(mode="plain")
    finally:
        resource.setrlimit(NOFILE, old)
    assert resource.prlimit(host.agent_pid, NOFILE) == (hard, hard)
    zygote = zygote_of(host)
    assert resource.prlimit(zygote, NOFILE) == (min(512, hard), hard)

    def limit_of_job(unit: str) -> tuple[int, ...]:
        host.launch([LaunchRequest(unit=unit, argv=(sys.executable, "-c", LIMIT_JOB),
                                   env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path),
                                   stdout=str(tmp_path / f"{unit}.out"), stderr=None)])
        assert finished(events, unit)[unit].result.exit_code == 0
        return tuple(int(x) for x in (tmp_path / f"{unit}.out").read_text().split())

    assert limit_of_job("new-worker") == limit_of_job("reused") == (min(512, hard), hard)
    # a new zygote, forked by the agent (raised) after the first was killed -9: its jobs too
    os.kill(zygote, signal.SIGKILL)
    # reaped, not only a zombie: the agent judges its zygote lost (its pipe's EOF) before it reaps it,
    # in the same turn of its loop; a job launched before that goes to the idle worker, no new zygote
    wait_until(lambda: proc_field(zygote, 0) is None, 10, "the agent to reap its killed zygote")
    assert limit_of_job("after-zygote") == (min(512, hard), hard)
    assert resource.prlimit(zygote_of(host), NOFILE) == (min(512, hard), hard)
