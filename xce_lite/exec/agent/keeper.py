"""`keep` and `relay`: the agent inside a Slurm allocation, reached through a relay that may die.

A Slurm step dies with the `srun` client that carries it (a killed client cancels its step, and
the processes in it die within seconds), and the controller's `srun` is as mortal as the
controller. So the agent is never run in such a step:

- `keep --dir DIR --spool SPOOL --host-name NAME [--lock-timeout S]` runs in the allocation's
  batch step (its script execs it) and listens on DIR/k.sock (a path relative to DIR, so a deep
  DIR cannot exceed a socket path's 107 bytes). For each connection it starts a fresh
  `serve --mode plain` agent whose stdin and stdout are that connection, exactly as a LocalHost
  or an SSH host starts one per connection; a new connection first shuts the previous one down,
  so the previous agent reads EOF and exits (it never touches running jobs on the way out) and
  the new one takes the spool's lock after it. The keeper is a child subreaper: supervisors whose
  agent exited stay its descendants, inside the batch step, where Slurm's process tracking
  (proctrack/linuxproc follows parent pids) still finds them when the allocation ends.
- With `--tcp`, it also listens on TCP, on the address the node's name resolves to, and writes
  "NAME PORT TOKEN" into DIR/k.tcp (readable by its user alone, on the file system the controller
  shares): a controller that can reach the node connects there straight, with TCP_NODELAY, and is
  served once its first line is the token. (`srun`'s own I/O forwarding sends a message of more
  than ~1 KB in pieces, and the second waits for a delayed ACK: ~40 ms a launch, measured.)
- `relay --dir DIR [--wait S]` connects its stdin and stdout to DIR/k.sock (retrying for S
  seconds while the keeper starts), and exits when either side ends. The controller runs it
  through `srun --overlap --jobid=ID` (or ssh to the node); when it dies, the agent behind it
  exits as on any EOF, and the jobs go on under the keeper.

Standard library only (ctypes for prctl), like the rest of the agent.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

SOCKET_NAME = "k.sock"
TCP_FILE = "k.tcp"
TOKEN_WAIT = 2.0  # seconds a TCP client has to send its token
PR_SET_CHILD_SUBREAPER = 36
USAGE = (
    "usage: agent.py keep --dir DIR --spool SPOOL --host-name NAME [--lock-timeout SECONDS] [--tcp 1]\n"
    "       agent.py relay --dir DIR [--wait SECONDS]"
)


def _opts(argv: list[str], known: set[str], required: set[str]) -> dict | None:
    opts = dict(zip(argv[0::2], argv[1::2]))
    if len(argv) % 2 or set(opts) - known or required - set(opts):
        print(USAGE, file=sys.stderr)
        return None
    return opts


def _subreaper() -> None:
    import ctypes  # only here: the keeper needs it, units never load this module

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"keeper: cannot become a child subreaper (errno {ctypes.get_errno()}); jobs whose "
              "agent exited may escape Slurm's tracking", file=sys.stderr)


def _reap(conns: dict) -> None:
    """Collect every ended child: agents, and supervisors orphaned to this subreaper. An agent's
    connection is closed once it has exited, so that its relay reads EOF then, not before."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = conns.pop(pid, None)
        if conn is not None:
            conn.close()


def keep_main(argv: list[str], agent_file: str) -> int:
    """Serve agents on DIR/k.sock until Slurm ends the allocation (SIGTERM). See the module docstring."""
    known = {"--dir", "--spool", "--host-name", "--lock-timeout", "--tcp"}
    opts = _opts(argv, known, {"--dir", "--spool", "--host-name"})
    if opts is None:
        return 2
    directory = os.path.abspath(opts["--dir"])
    os.makedirs(directory, exist_ok=True)
    os.chdir(directory)
    _subreaper()
    log = os.open(os.path.join(directory, "agent.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.unlink(SOCKET_NAME)  # a keeper of this directory before (a requeued allocation's)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET_NAME)
    os.chmod(SOCKET_NAME, 0o600)  # the agent runs jobs as its user: only that user may reach it
    listener.listen(4)
    tcp, token = _tcp_listener() if opts.get("--tcp") == "1" else (None, "")
    conns: dict[int, socket.socket] = {}  # agent pid -> its connection, kept to shut it down
    signal.signal(signal.SIGCHLD, lambda _n, _f: _reap(conns))
    signal.signal(signal.SIGTERM, lambda _n, _f: sys.exit(0))
    argv_serve = [sys.executable, "-S", "-E", agent_file, "serve", "--spool", os.path.abspath(opts["--spool"]),
                  "--host-name", opts["--host-name"], "--mode", "plain",
                  "--lock-timeout", opts.get("--lock-timeout", "30")]
    print(f"keeper: pid {os.getpid()} serving agents for {opts['--host-name']} on {directory}/{SOCKET_NAME}",
          file=sys.stderr, flush=True)
    import select

    listeners = [listener] if tcp is None else [listener, tcp]
    while True:
        ready, _, _ = select.select(listeners, [], [])  # PEP 475: retried after SIGCHLD
        conn, _ = ready[0].accept()
        if ready[0] is tcp and not _token_ok(conn, token):
            conn.close()
            continue
        for old in list(conns.values()):
            # The previous relay may be half dead: make its agent read EOF, so that it lets the
            # spool's lock go for the new one (it leaves running jobs alone).
            try:
                old.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        pid = os.fork()
        if pid == 0:
            try:
                os.dup2(conn.fileno(), 0)
                os.dup2(conn.fileno(), 1)
                os.dup2(log, 2)
                os.execv(argv_serve[0], argv_serve)
            finally:
                os._exit(127)
        conns[pid] = conn
        _reap(conns)  # an agent that ended before it was recorded


def _tcp_listener() -> tuple[socket.socket, str]:
    """A TCP listener on the node's address, announced with a fresh token in TCP_FILE (in the cwd)."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = ""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind((address, 0))
    tcp.listen(4)
    token = os.urandom(16).hex()
    tmp = f"{TCP_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{name} {tcp.getsockname()[1]} {token}\n")
    os.rename(tmp, TCP_FILE)
    return tcp, token


def _token_ok(conn: socket.socket, token: str) -> bool:
    """Whether the TCP client's first line is the token (read byte by byte: nothing after it is taken)."""
    import hmac

    conn.settimeout(TOKEN_WAIT)
    line = b""
    try:
        while not line.endswith(b"\n") and len(line) <= 2 * len(token):
            byte = conn.recv(1)
            if not byte:
                return False
            line += byte
    except OSError:
        return False
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return hmac.compare_digest(line.strip(), token.encode())


def relay_main(argv: list[str]) -> int:
    """Pump stdin -> DIR/k.sock and DIR/k.sock -> stdout until either ends."""
    opts = _opts(argv, {"--dir", "--wait"}, {"--dir"})
    if opts is None:
        return 2
    try:
        os.chdir(opts["--dir"])
    except OSError as exc:
        print(f"relay: cannot enter {opts['--dir']}: {exc.strerror}; is the allocation's keeper running?",
              file=sys.stderr)
        return 3
    deadline = time.monotonic() + float(opts.get("--wait", "60"))
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(SOCKET_NAME)
            break
        except OSError as exc:
            sock.close()
            if time.monotonic() >= deadline:
                print(f"relay: no keeper answers on {opts['--dir']}/{SOCKET_NAME}: {exc.strerror}", file=sys.stderr)
                return 3
            time.sleep(0.1)
    import select

    fds = {0: sock.fileno(), sock.fileno(): 1}
    while True:
        ready, _, _ = select.select(list(fds), [], [])
        for src in ready:
            try:
                data = os.read(src, 1 << 16)
            except OSError:
                data = b""
            if not data:
                if src == 0:  # the controller's side ended: let the agent read EOF too
                    sock.shutdown(socket.SHUT_WR)
                    del fds[0]
                    break
                return 0  # the agent ended: so does the relay
            view = memoryview(data)
            while view:
                view = view[os.write(fds[src], view) :]
