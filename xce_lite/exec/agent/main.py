"""The agent's commands: serve, exec, pre, post, launch (see docs/agent-protocol.md), and keep and
relay (a Slurm allocation's: keeper.py). main() takes the Bundle that runs it (loader.py): the file
units run, and its compiled form in SPOOL/bin.

Each command imports only what it needs: units start a fresh interpreter per job.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time

from .jsonl import dumps
from .util import AGENT_UMASK, BIN, UNITS, poke, read_text, shell_quote, write_file

MODES = ("auto", "systemd", "user", "plain")
HANDOVER_ASK = 1.0  # seconds between two asks to the spool's holder to hand it over
USAGE = (
    "usage: agent.py serve --spool DIR [--host-name NAME] [--mode auto|systemd|user|plain] [--records unit|agent]\n"
    "                      [--lock-timeout SECONDS] [--journal-limit BYTES]\n"
    "       agent.py exec UNIT_DIR | pre UNIT_DIR | post UNIT_DIR      (inside a systemd unit)\n"
    "       agent.py launch -- CMD [ARG...]              (inside a job: `xce launch`)\n"
    "       agent.py keep --dir DIR --spool SPOOL --host-name NAME | relay --dir DIR   (Slurm allocations)"
)


def prepare_spool(spool: str, code: str) -> None:
    """SPOOL/units, and SPOOL/bin/xce: a shim for jobs on hosts where xce is not installed, which
    runs `agent launch`, so that `xce launch -- CMD` works there too."""
    os.makedirs(os.path.join(spool, UNITS), exist_ok=True)
    shim = os.path.join(spool, BIN, "xce")
    text = (
        "#!/bin/sh\n# written by the xce host agent: on this host only `xce launch -- CMD` works, inside a job\n"
        f"exec {shell_quote(sys.executable)} -S -E {shell_quote(code)} \"$@\"\n"
    )
    if read_text(shim) != text:
        write_file(shim, text.encode("utf-8", "surrogateescape"), mode=0o700)


def make_private(spool: str) -> None:
    """Close the spool to other users (0700), as an older agent may have left it open: its files
    (journal, specs, env files) hold jobs' environments. Its subdirectories and files are made
    0700/0600 as they are created. But for 0711 on a root agent's spool, units/ and bin/: an earlier
    agent opened them to pass through (runas.share_spool) for jobs run as other users, which may
    still run and must reach their own directories (nobody may list them or read a file in them)."""
    for path in (spool, os.path.join(spool, UNITS), os.path.join(spool, BIN)):
        mode = os.stat(path).st_mode & 0o777 if os.path.isdir(path) else 0o700
        if mode & 0o077 and not (mode == 0o711 and os.geteuid() == 0):
            os.chmod(path, 0o700)


def run_as_bytecode(spool: str, argv: list[str], bundle) -> None:
    """Started from source (`python -S -E agent.py serve ...`, as the controller starts it): exec
    this process again from the agent's bytecode in SPOOL/bin (bundle.compiled), same pid, same
    pipes. Compiling the agent at every start leaves the compiler's ~10 MB in the agent's heap for
    good, and the agent forks a supervisor per job: every fork copies the page tables of that
    memory, and the copy-on-write faults that follow cost each job ~0.5 ms (bench/cpu_per_job.py).
    Where the bytecode cannot be written, the agent goes on from source."""
    try:
        code = bundle.compiled(os.path.join(spool, BIN))
    except (OSError, SyntaxError):
        return
    if code != bundle.path:
        os.execv(sys.executable, [sys.executable, "-S", "-E", code, *argv])


def take_spool_lock(spool: str, timeout: float) -> int:
    """Hold the spool's exclusive lock (one agent per spool); wait up to `timeout` seconds for it.
    An agent that holds it for no controller (an orphan enforcing a lease) is asked to hand over,
    and asked again every HANDOVER_ASK seconds: one still reading a dying channel refuses, and hands
    over only once it sees the channel end (or its lease run out)."""
    fd = os.open(os.path.join(spool, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + timeout
    ask_at = 0.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= ask_at:
                poke(spool, handover=True)
                ask_at = time.monotonic() + HANDOVER_ASK
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise SystemExit(
                    fatal(
                        f"another agent (pid {holder}) is serving spool {spool}; stop it "
                        "(or wait for it to see its controller gone), then reconnect"
                    )
                )
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def fatal(message: str) -> int:
    """Tell the controller why this agent cannot serve; the exit code to use."""
    os.write(1, dumps({"event": "fatal", "error": message}))
    print(f"agent: {message}", file=sys.stderr)
    return 2


def serve_main(argv: list[str], bundle) -> int:
    """`serve`: answer the controller's requests on stdin until EOF (server.Agent). `bundle` is the
    Bundle (loader.py) this interpreter runs: its compiled form is what units run."""
    opts = dict(zip(argv[1::2], argv[2::2]))
    known = {"--spool", "--host-name", "--mode", "--records", "--lock-timeout", "--journal-limit"}
    if "--spool" not in opts or len(argv) % 2 != 1 or set(opts) - known:
        print(USAGE, file=sys.stderr)
        return 2
    mode = opts.get("--mode", "auto")
    if mode not in MODES:
        return fatal(f"unknown mode {mode!r}: use auto, systemd, user or plain")
    records = opts.get("--records", "unit")
    if records not in ("unit", "agent"):
        return fatal(f"unknown --records {records!r}: use unit (the unit's stop command) or agent")
    # Jobs inherit the fds of their supervisor, a fork of this process, that are not close-on-exec:
    # keep none but stdin, stdout and stderr (which every job gets replaced).
    os.closerange(3, 1 << 20)
    os.umask(AGENT_UMASK)  # what it (and the supervisors it forks) makes is private; jobs get their own
    spool = os.path.abspath(opts["--spool"])
    # Started from a directory it may not enter (another user's, a 0700 checkout): its forks open
    # "." (pool.py's workers return there between jobs), and every path it keeps is absolute.
    os.chdir("/")
    try:
        os.makedirs(os.path.join(spool, BIN), exist_ok=True)
        os.makedirs(os.path.join(spool, UNITS), exist_ok=True)
        make_private(spool)
    except OSError as exc:
        return fatal(f"cannot create spool {spool}: {exc.strerror}; choose a writable directory")
    run_as_bytecode(spool, argv, bundle)
    from .journal import JOURNAL_LIMIT  # here, not at the top: units, which import this module, need none of these
    from .probe import cgroup_version, probe_modes
    from .systemd import unit_scripts

    lock_fd = take_spool_lock(spool, float(opts.get("--lock-timeout", 10)))
    cgroup, code = cgroup_version(), bundle.path
    modes, host = probe_modes({"python": sys.executable, "agent": code, "spool": spool}, cgroup)
    host.update(modes=modes, cgroup=cgroup)
    # Who records a direct unit's end: its ExecStopPost ("unit", the default), or the agent ("agent":
    # cheaper, but systemd keeps no CPU time or peak memory: manager.py). The host's `unit_accounting`.
    host["direct_records"] = records
    if mode == "auto":
        mode = next(m for m in ("systemd", "user", "plain") if modes[m]["ok"])
    elif not modes[mode]["ok"]:
        return fatal(
            f"this host cannot run units in mode {mode}, which its `launch:` setting asks for: "
            f"{modes[mode]['why']}; fix that, or set `launch: auto`"
        )
    scripts = None
    try:
        if mode != "plain":
            code = bundle.compiled(os.path.join(spool, BIN))
            if host["tools"] is not None:
                scripts = unit_scripts(spool, cgroup)
        prepare_spool(spool, code)
    except (OSError, SyntaxError) as exc:
        return fatal(f"cannot prepare spool {spool}: {exc}; check the spool's file system")
    from .fds import raise_fd_limit

    raise_fd_limit()  # one socket per reused supervisor: see fds.py (jobs keep the limit we were given)
    zygote = None
    if mode == "plain":  # forked now, before the server's modules and state grow this process
        from .zygote import start_zygote

        try:
            zygote = start_zygote(spool, lock_fd)
        except OSError as exc:
            print(f"agent: cannot fork a zygote ({exc}); forking supervisors itself", file=sys.stderr)
    from .server import Agent

    try:
        limit = int(opts.get("--journal-limit", JOURNAL_LIMIT))
        agent = Agent(spool, opts.get("--host-name") or os.uname().nodename, limit, mode, host, lock_fd, code, scripts)
    except OSError as exc:
        return fatal(f"cannot use the journal in spool {spool}: {exc}; check the spool's file system")
    agent.state.zygote = zygote
    agent.link.connect_bus(now=True)
    agent.link.release_recorded()
    agent.tasks.open_socket()
    from .cpuslice import short_slice

    short_slice()  # a short CPU slice with XCE_AGENT_SLICE=1, not passed on to what it forks (cpuslice.py)
    try:
        agent.serve()
    except BrokenPipeError:
        agent.manager.finish_starting()  # the controller went away while we wrote: exit as on EOF
    os.close(lock_fd)
    return 0


def main(argv: list[str], bundle) -> int:
    """Run the command `argv` names; its exit status. `bundle`: the Bundle (loader.py) that runs
    this interpreter. A command imports its modules only here: a unit's `exec` never loads the
    server's."""
    command = argv[0] if argv else None
    if command in ("exec", "pre", "post") and len(argv) == 2:
        from . import steps

        unit_dir = os.path.abspath(argv[1])
        return {"exec": steps.exec_main, "pre": steps.pre_main, "post": steps.post_main}[command](unit_dir)
    if command == "launch":
        from .launch import launch_main

        return launch_main(argv[1:])
    if command == "serve":
        return serve_main(argv, bundle)
    if command in ("keep", "relay"):
        from . import keeper

        return keeper.keep_main(argv[1:], bundle.origin) if command == "keep" else keeper.relay_main(argv[1:])
    if command is not None and not command.startswith("-"):
        print(f"agent: unknown command {command!r}; on a host without xce, only `xce launch -- CMD` works "
              "(inside a job)", file=sys.stderr)
    print(USAGE, file=sys.stderr)
    return 2

