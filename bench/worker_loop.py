#!/usr/bin/env python3
"""CPU per job of one reused supervisor (exec/agent/pool.py's worker) and of its `true` jobs, with
this process as its agent: no controller, no agent loop, so ~1 s per run and little else in it.

    python bench/worker_loop.py [--jobs 900] [--runs 3] [--tree CHECKOUT]
    python bench/worker_loop.py --without dir,sync,tasks,lease     # what each part costs (stubbed)
    python bench/worker_loop.py --tree /work/wt/NAME-old --runs 1  # alternate with this tree's runs
    python bench/worker_loop.py --handover   # each job sent right after the last one's "r", before its "i"

A worker forked as the zygote forks one (fork_detached), on a socket; each job is what the agent
hands a worker (a spec like a plain launch's: env of 15 variables, a hostfile, the spool's lease,
the journal) and the release ("r", "i") that follows its "d". Per job, from /proc/PID/stat (clock
ticks: keep --jobs near MAX_JOBS for resolution): the worker's own user and system CPU and its
reaped jobs', and its run time from /proc/PID/schedstat (ns) and its wake-ups (voluntary context
switches: a count). --without stubs parts in the worker (a what-if: never a mode to run in): `dir` the
host directory (mkdir, hostfile, unlink, rmdir), `sync` the journal's fdatasyncs (the result's was
the worker's own until e882d14; since, the agent syncs a worker's results once per loop turn and a
worker syncs only as it exits: this loop, the agent here, syncs none, so the worker's figure holds
no fdatasync per job and `--without sync` no longer changes it), `tasks` the
listing of the host directory for tasks, `lease` the reads of SPOOL/lease. The spool's units
directory is where the tree's agent puts it (a tmpfs where its exec/agent/unitsdir.py is; else
SPOOL/units). Also per job: the kernel's threads and interrupts over the run (kthreads.py: the
whole machine's, so other processes' I/O counts in it too). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kthreads import KernelShare


def job_line(spool: str, work: str, name: str, encode) -> bytes:
    host_dir = f"{spool}/units/{name}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "XCE_APP": "default", "XCE_JOBID": name,
           "XCE_JOB_NAME": "true", "XCE_QUEUE": "normal", "XCE_SLOTS": "1", "XCE_HOSTS": "local",
           "XCE_ATTEMPT": "1", "XCE_HOST_NTASKS": "1", "XCE_HOST_TASK_INDEX": "0", "XCE_UNIT": name,
           "XCE_JOB_HOST_DIR": host_dir, "XCE_LAUNCH_SOCKET": f"{spool}/agent.sock",
           "XCE_HOSTFILE": f"{host_dir}/hostfile"}
    now = time.time()
    spec = {"unit": name, "argv": ["true"], "env": env, "cwd": work, "stdout": f"{work}/out", "stderr": None,
            "run_limit": None, "mem_limit": None, "grace": 2.0, "hostfile": "local slots=1\n", "hooks": None,
            "profile_env": None, "post_failure": None, "starter": None, "umask": None, "role": "job",
            "start_time": now, "spool": spool, "mode": "plain", "host_dir": host_dir,
            "host_dir_by": "supervisor", "hooks_by": "supervisor"}
    return (encode({"unit": name, "spec": spec, "start_time": now}) + "\n").encode("ascii")


def stub(parts: set[str]) -> None:
    """In the worker (after its fork): replace the named parts by nothing."""
    from xce_lite.exec.agent import journal, supervisor, watch

    if "dir" in parts:
        supervisor.make_host_dir = lambda spec, kept=None: True  # type: ignore[assignment, return-value]
        supervisor.remove_host_dir = lambda spec: None  # type: ignore[assignment]
    if "sync" in parts:
        journal.os = type("NoSyncOs", (), {"__getattr__": lambda self, name: getattr(os, name),  # type: ignore
                                           "fdatasync": staticmethod(lambda fd: None)})()
    if "tasks" in parts:
        watch.Watch.start_tasks = lambda self: None  # type: ignore[method-assign]
    if "lease" in parts:
        watch.Watch.lease_lapsed = lambda self: None  # type: ignore[method-assign]
        watch.Watch.look_at_lease = lambda self, now, force=False: None  # type: ignore[method-assign]


def ticks(pid: int) -> list[int]:
    """utime, stime, cutime, cstime of `pid`, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        return [int(x) for x in f.read().rsplit(")", 1)[1].split()[11:15]]


def run_ns(pid: int) -> int:
    """The CPU time `pid` has run (ns, /proc/PID/schedstat: finer than the clock ticks)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def wakeups(pid: int) -> int:
    """`pid`'s voluntary context switches: how often it blocked and was woken (a count)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("voluntary_ctxt_switches")).split()[1])


def run(jobs: int, parts: set[str], handover: bool = False) -> list[float]:
    """One worker, a warm-up of 50 jobs, then `jobs`; per job: worker user, system, jobs, kernel (ms),
    the worker's run time from schedstat (ms) and its wake-ups."""
    import gc

    from xce_lite.exec.agent.fds import restore_for_jobs
    from xce_lite.exec.agent.journal import record
    from xce_lite.exec.agent.jsonl import encode
    from xce_lite.exec.agent.lease import clock, write_lease
    from xce_lite.exec.agent.pool import MAX_JOBS, send_job, worker_main
    from xce_lite.exec.agent.supervisor import fork_detached
    from xce_lite.exec.agent.tree import load_prctl
    from xce_lite.exec.agent.util import boot_id

    assert jobs + 50 < MAX_JOBS, f"--jobs must stay below {MAX_JOBS - 50}: a worker leaves after MAX_JOBS"
    root = tempfile.mkdtemp(prefix="xb-wl-", dir="/tmp")
    try:
        spool, work = f"{root}/spool", f"{root}/w"
        os.makedirs(spool)
        try:  # the units' directory where the tree's agent puts it (a tmpfs: exec/agent/unitsdir.py)
            from xce_lite.exec.agent.unitsdir import place
        except ImportError:  # an older tree: in the spool
            os.mkdir(f"{spool}/units")
        else:
            place(spool)
        os.mkdir(work)
        with open(f"{spool}/journal", "wb") as f:
            f.write(record("journal", version=1))
        lock = os.open(f"{spool}/.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        boot = boot_id()
        write_lease(spool, boot, clock() + 3600, clock(), 3600)
        gc.disable()  # as in the zygote
        restore_for_jobs()
        load_prctl()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)

        def worker() -> None:
            stub(parts)
            worker_main(theirs.fileno(), spool, boot)

        pid = fork_detached(worker)
        theirs.close()

        def one(i: int) -> None:
            send_job(ours, job_line(spool, work, f"u{i}", encode), lock)
            if handover:  # each job goes right after the last one's "r", before its "i" (Workers.take)
                want, got = b"d" if i == 0 else b"id", b""  # the last job's "i", then this one's "d"
                while len(got) < len(want):
                    got += ours.recv(len(want) - len(got))
                assert got == want, got
                ours.sendall(b"r")
                return
            assert ours.recv(1) == b"d"
            ours.sendall(b"r")
            assert ours.recv(1) == b"i"

        for i in range(50):
            one(i)
        before, kernel, ns, woke = ticks(pid), KernelShare(), run_ns(pid), wakeups(pid)
        for i in range(50, 50 + jobs):
            one(i)
        if handover:
            assert ours.recv(1) == b"i"  # the last job's
        after, kernel_spent = ticks(pid), kernel.seconds()
        ns, woke = run_ns(pid) - ns, wakeups(pid) - woke
        ours.close()
        os.waitpid(pid, 0)
        os.close(lock)
        per = [1000 * (b - a) / os.sysconf("SC_CLK_TCK") / jobs for a, b in zip(before, after)]
        return [per[0], per[1], per[2] + per[3], 1000 * kernel_spent["kernel"] / jobs, ns / 1e6 / jobs, woke / jobs]
    finally:
        if os.path.islink(f"{root}/spool/units"):
            shutil.rmtree(os.readlink(f"{root}/spool/units"), ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=900)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="the checkout to measure")
    parser.add_argument("--without", default="", help="parts stubbed in the worker: dir,sync,tasks,lease")
    parser.add_argument("--handover", action="store_true",
                        help="hand each job right after the last one's release, before its \"i\" (as the agent's "
                             "launch does when it finds the worker released, not idle)")
    args = parser.parse_args(argv)
    sys.path.insert(0, args.tree)
    parts = {p for p in args.without.split(",") if p}
    unknown = parts - {"dir", "sync", "tasks", "lease"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    print(f"tree {args.tree}; {args.jobs} `true` jobs per run; without {sorted(parts) or 'nothing'}; "
          f"{'each job handed before the last one is idle; ' if args.handover else ''}"
          f"load {os.getloadavg()[0]:.1f}")
    rows = []
    for n in range(args.runs):
        user, system, jobs, kernel, ran, woke = run(args.jobs, parts, args.handover)
        rows.append((user + system, user, system, jobs, kernel, user + system + kernel, ran, woke))
        print(f"run {n + 1}: worker {user + system:.3f} ms per job (user {user:.3f}, system {system:.3f}; "
              f"schedstat {ran:.3f}; {woke:.2f} wake-ups); its jobs {jobs:.3f} ms; the kernel's threads and "
              f"interrupts {kernel:.3f} ms; worker + kernel {user + system + kernel:.3f} ms "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    if args.runs > 1:
        med = [statistics.median(c) for c in zip(*rows)]
        print(f"median: worker {med[0]:.3f} ms (user {med[1]:.3f}, system {med[2]:.3f}; schedstat {med[6]:.3f}; "
              f"{med[7]:.2f} wake-ups); jobs {med[3]:.3f} ms; kernel {med[4]:.3f} ms; worker + kernel {med[5]:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
