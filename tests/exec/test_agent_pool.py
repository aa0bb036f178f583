"""Reused supervisors (exec/agent/pool.py) on real processes: plain jobs in sequence run in one
supervisor, and each gets what a fresh supervisor would give it (no fd, lock, umask, cwd, env,
signal mask or stale signal of the job before), its own process group in the supervisor's session;
and under faults in sequence (a worker killed -9 in mid-job, the next launch, the agent killed -9
while a reused worker runs a job, a new agent), jobs end once, are reported, and nothing is left."""

from __future__ import annotations

import json
import os
import signal
import sys


from tests.support.agent_local import WAIT_JOB, finished, journal
from tests.support.procs import proc_field
from tests.support.raw_agent import py, unit
from tests.support.waiting import wait_until
from xce_lite.exec.agent.pool import poolable
from xce_lite.exec.host import LaunchRequest

# prints (JSON) what the job inherited: its open fds, umask, cwd, environment, blocked and ignored
# signals, whether it leads its process group, its session; then waits for its go file (argv[1])
PROBE = (
    "import json, os, sys, time\n"
    "def is_open(fd):\n"
    "    try:\n"
    "        return os.fstat(fd) is not None\n"
    "    except OSError:\n"
    "        return False\n"
    "st = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
    "m = os.umask(0); os.umask(m)\n"
    "print(json.dumps({'fds': [fd for fd in range(1024) if is_open(fd)], 'umask': m,\n"
    "      'cwd': os.getcwd(), 'env': sorted(os.environ), 'blocked': st['SigBlk'], 'ignored': st['SigIgn'],\n"
    "      'leader': os.getpgid(0) == os.getpid(), 'sid': os.getsid(0)}), flush=True)\n"
    "end = time.time() + 60\n"
    "while len(sys.argv) > 1 and not os.path.exists(sys.argv[1]) and time.time() < end:\n"
    "    time.sleep(0.02)\n"
)


def probe(tmp_path, unit: str, cwd, umask: int, env: dict, go: bool = False) -> LaunchRequest:
    argv = (sys.executable, "-c", PROBE, *([str(tmp_path / f"go-{unit}")] if go else []))
    return LaunchRequest(unit=unit, argv=argv, env={"PATH": os.environ["PATH"], **env}, cwd=str(cwd),
                         stdout=str(tmp_path / f"{unit}.out"), stderr=None, umask=umask)


def waiter(tmp_path, unit: str, code: int = 0) -> LaunchRequest:
    argv = (sys.executable, "-c", WAIT_JOB, str(tmp_path / f"go-{unit}"), str(code))
    return LaunchRequest(unit=unit, argv=argv, env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path),
                         stdout=str(tmp_path / f"{unit}.out"), stderr=None)


def alive(pid: int) -> bool:
    return proc_field(pid, 0) not in (None, "Z")


def test_jobs_in_sequence_share_a_supervisor_and_inherit_nothing_of_each_other(hosts, spool, tmp_path):
    host, events = hosts(mode="plain")
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    host.launch([probe(tmp_path, "one", tmp_path / "d1", 0o077, {"ONLY_ONE": "x"}, go=True)])
    worker = wait_until(lambda: journal(spool)["one"]["pid"], 10, "the first job to start")
    # a kill of the first job that reaches its supervisor once the job has ended but before the
    # agent has read its result (the agent stopped meanwhile) is dropped, not taken as a kill of
    # the next job
    os.kill(host.agent_pid, signal.SIGSTOP)
    try:
        (tmp_path / "go-one").touch()
        wait_until(lambda: journal(spool)["one"]["result"], 10, "the first job's result")
        os.kill(worker, signal.SIGTERM)
    finally:
        os.kill(host.agent_pid, signal.SIGCONT)
    assert finished(events, "one")["one"].result.exit_code == 0
    host.launch([probe(tmp_path, "two", tmp_path / "d2", 0o027, {"ONLY_TWO": "y"})])
    got = finished(events, "two")["two"].result
    assert (got.exit_code, got.reason) == (0, None)
    assert journal(spool)["two"]["pid"] == worker  # the same supervisor ran both
    host.launch([probe(tmp_path, "fresh", tmp_path / "d2", 0o027, {"ONLY_TWO": "y"}, go=True)])
    fresh = wait_until(lambda: journal(spool)["fresh"]["pid"], 10, "the third job to start")
    assert fresh == worker  # and the third: a job that is still running, with the first one's gone
    one, two = (json.loads((tmp_path / f"{u}.out").read_text()) for u in ("one", "two"))
    assert one["fds"] == two["fds"] == [0, 1, 2]  # no lock, no socket, nothing else
    assert (one["umask"], two["umask"]) == (0o077, 0o027)
    assert (one["cwd"], two["cwd"]) == (str(tmp_path / "d1"), str(tmp_path / "d2"))
    assert "ONLY_ONE" in one["env"] and "ONLY_ONE" not in two["env"] and "ONLY_TWO" in two["env"]
    assert one["blocked"] == two["blocked"] == "0000000000000000"
    assert one["ignored"] == two["ignored"]
    assert one["leader"] and two["leader"]  # each job leads a process group of its own
    assert one["sid"] == two["sid"] == worker  # in the supervisor's session
    (tmp_path / "go-fresh").touch()
    assert finished(events, "fresh")["fresh"].result.exit_code == 0
    assert json.loads((tmp_path / "fresh.out").read_text())["fds"] == [0, 1, 2]


def test_a_job_starts_with_no_signal_ignored_or_blocked_whatever_the_agent_inherited(hosts, spool, tmp_path):
    # an agent started under nohup or by a shell's `&` inherits ignored signals (HUP, INT, QUIT,
    # TTOU...), which survive exec: none reaches a job, the first in a new worker nor the next in
    # the same one. The job is not Python (which ignores PIPE and XFSZ itself); libc's posix_spawn
    # leaves its two internal signals (32, 33) ignored, as it does for every program it starts.
    inherited = (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP, signal.SIGHUP, signal.SIGALRM, signal.SIGPIPE)
    old = {signum: signal.signal(signum, signal.SIG_IGN) for signum in inherited}
    try:
        host, events = hosts(mode="plain")
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
    ignored_by_agent = int(proc_status(host.agent_pid)["SigIgn"], 16)
    assert all(ignored_by_agent & (1 << (signum - 1)) for signum in inherited)  # the premise
    for name in ("first", "second"):
        host.launch([LaunchRequest(unit=name, argv=("cat", "/proc/self/status"), env={"PATH": os.environ["PATH"]},
                                   cwd=str(tmp_path), stdout=str(tmp_path / f"{name}.out"), stderr=None)])
        assert finished(events, name)[name].result.exit_code == 0
    assert journal(spool)["first"]["pid"] == journal(spool)["second"]["pid"]  # one reused worker
    for name in ("first", "second"):
        lines = (tmp_path / f"{name}.out").read_text().splitlines()
        status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        assert status["SigIgn"] == "0000000180000000", name  # 32 and 33 alone
        assert (status["SigBlk"], status["SigCgt"]) == ("0000000000000000", "0000000000000000"), name


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


def test_a_worker_killed_in_mid_job_then_the_agent_killed_then_a_new_agent(hosts, spool, tmp_path):
    host, events = hosts(mode="plain")
    host.launch([probe(tmp_path, "warm", tmp_path, 0o022, {})])
    finished(events, "warm")
    worker = journal(spool)["warm"]["pid"]
    # 1. the reused worker is killed -9 while its second job runs: the job is killed with it (the
    # worker's session), and the unit says why
    host.launch([waiter(tmp_path, "victim")])
    job = wait_until(lambda: journal(spool)["victim"]["job"], 10, "the victim to start")
    assert journal(spool)["victim"]["pid"] == worker
    os.kill(worker, signal.SIGKILL)
    got = finished(events, "victim")["victim"].result
    assert got.reason.startswith("supervisor lost") and "remaining processes were killed" in got.reason
    wait_until(lambda: not alive(job), 10, "the lost job's process to be killed")
    # 2. the next launches work (a new worker), and a job runs in a reused one again
    host.launch([probe(tmp_path, "after", tmp_path, 0o022, {})])
    finished(events, "after")
    host.launch([waiter(tmp_path, "carried", 9)])
    carrier = wait_until(lambda: journal(spool)["carried"]["pid"], 10, "the carried job to start")
    assert carrier == journal(spool)["after"]["pid"] != worker
    # 3. the agent is killed -9 while the reused worker runs it: a new agent takes the spool (no
    # idle worker nor job holds its lock), adopts the job, and it ends once, with its own code
    os.kill(host.agent_pid, signal.SIGKILL)
    again, events = hosts(mode="plain")
    [adopted] = again.launch([waiter(tmp_path, "carried", 9)])
    assert adopted.status == "running"
    (tmp_path / "go-carried").touch()
    assert finished(events, "carried")["carried"].result.exit_code == 9
    wait_until(lambda: not alive(carrier), 10, "the old agent's worker to leave once its job ended")
    # 4. and the new agent's own jobs run, in its own workers
    again.launch([probe(tmp_path, "last", tmp_path, 0o022, {})])
    assert finished(events, "last")["last"].result.exit_code == 0
    assert journal(spool)["last"]["pid"] not in (worker, carrier)


def test_only_plain_jobs_of_the_agents_own_user_without_supervisor_hooks_are_pooled():
    plain = {"role": "job", "host_dir_by": "supervisor", "user": None, "hooks": [], "hooks_by": "supervisor"}
    assert poolable(plain)
    assert not poolable({**plain, "user": {"name": "u", "uid": 1000, "gid": 1000, "groups": [], "home": "/"}})
    assert not poolable({**plain, "hooks": [{"argv": ["true"]}]})
    assert not poolable({**plain, "role": "host"})
    assert not poolable({**plain, "host_dir_by": "agent"})


def journal_fds(pid: int, path) -> list[str]:
    """What the fds of `pid` that were opened on the journal at `path` name now ("... (deleted)" once
    a compaction has replaced that file)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


def flocks_of(pid: int) -> list[str]:
    with open("/proc/locks") as f:
        return [line for line in f.read().splitlines() if line.split()[4:5] == [str(pid)]]


def test_a_worker_keeps_the_journal_open_unlocked_between_jobs_and_follows_compactions(agents, spool, tmp_path):
    """One journal fd per worker, not an open and a close per record: held while idle, with no lock
    on it (the agent compacts meanwhile); after a compaction the worker's records go to the new
    file; then the worker killed -9 while idle, and a new one takes over."""
    agent = agents("--journal-limit", "3000")
    leave = ("import os, sys; d = os.environ['XCE_JOB_HOST_DIR']; print(open(d + '/hostfile').read(), end='');"
             " open(d + '/left', 'w').write('x')")
    agent.launch(unit("first", py(leave), tmp_path, hostfile="h1 slots=1\n"))
    assert agent.finished("first")["exit_code"] == 0
    assert (tmp_path / "first.out").read_text() == "h1 slots=1\n"
    assert not (spool / "units" / "first").exists()  # removed with what the job left in it
    worker = journal(spool)["first"]["pid"]
    journal_path = spool / "journal"
    held = wait_until(lambda: journal_fds(worker, journal_path), 10, "the idle worker's journal fd")
    assert held == [str(journal_path)] and flocks_of(worker) == []
    inode, n = journal_path.stat().st_ino, 0
    while journal_path.stat().st_ino == inode:  # one job at a time: each runs in the same worker
        n += 1
        assert n < 40, "the journal was never compacted"
        name = f"j{n}"
        agent.launch(unit(name, ["true"], tmp_path, hostfile="h1 slots=1\n"))
        assert agent.finished(name)["exit_code"] == 0
        assert journal(spool)[name]["pid"] == worker
        assert all(u["ok"] for u in agent.request("forget", units=[name])["units"])
    agent.launch(unit("after", ["true"], tmp_path))
    assert agent.finished("after")["exit_code"] == 0
    assert journal(spool)["after"]["pid"] == worker  # read from the compacted file: it wrote there
    wait_until(lambda: journal_fds(worker, journal_path) == [str(journal_path)], 10, "the worker to hold the new file")
    assert flocks_of(worker) == []
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: not alive(worker), 10, "the worker to die")
    agent.launch(unit("last", ["true"], tmp_path))
    assert agent.finished("last")["exit_code"] == 0
    assert journal(spool)["last"]["pid"] != worker


def test_a_job_that_puts_a_symlink_in_place_of_its_host_dir_removes_nothing_through_it(agents, spool, tmp_path):
    """The host directory goes through the directory itself: a job that swapped it for a symlink to
    another directory holding a `hostfile` leaves that file alone (and the job's own directory,
    moved aside, is its to keep)."""
    agent = agents()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "hostfile").write_text("not the job's\n")
    swap = ("import os; d = os.environ['XCE_JOB_HOST_DIR']; os.rename(d, d + '.moved');"
            f" os.symlink({str(elsewhere)!r}, d)")
    agent.launch(unit("swapper", py(swap), tmp_path, hostfile="h1 slots=1\n"))
    assert agent.finished("swapper")["exit_code"] == 0
    assert (elsewhere / "hostfile").read_text() == "not the job's\n"
    assert (spool / "units" / "swapper.moved").is_dir()  # the job's own, moved aside by it
    assert not (spool / "units" / "swapper").exists() and not (spool / "units" / "swapper").is_symlink()


def test_a_send_to_a_worker_waits_for_room_and_gives_up_on_one_that_reads_nothing(monkeypatch):
    import socket
    import threading

    from xce_lite.exec.agent import pool

    monkeypatch.setattr(pool, "SEND_WAIT", 0.5)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)  # as Workers.add makes the agent's end
        while True:  # fill the worker's buffer
            try:
                ours.send(b"x" * 65536)
            except BlockingIOError:
                break
        try:
            pool.send(ours, lambda: ours.send(b"job\n"))
        except TimeoutError as exc:
            assert "read nothing" in str(exc)
        else:
            raise AssertionError("a send to a worker that reads nothing returned")
        # a worker that reads meanwhile: the send goes through once there is room
        got = bytearray()

        def read_all() -> None:
            while not got.endswith(b"job\n"):
                got.extend(theirs.recv(1 << 20))

        theirs.settimeout(10)
        reader = threading.Thread(target=read_all)
        reader.start()
        assert pool.send(ours, lambda: ours.send(b"job\n")) == 4
        reader.join(10)
        assert got.endswith(b"job\n") and not reader.is_alive()
