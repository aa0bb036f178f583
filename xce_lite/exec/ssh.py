"""SshHost: the Host seam (host.py) for a machine reached over SSH, with nothing installed on it but
sshd and python3. The controller runs these connections in its SSH gateway process (sshgate.py,
through `open_agent`); SshHost itself serves short-lived users (`xce hosts add`'s probe, tests).

One SSH connection per host (fabric/paramiko), and on it ONE long-lived channel that runs the agent
(the package exec/agent/, standard library only, shipped as the one file bundle.py builds) and
carries its JSON lines both ways: an AgentChannel over the channel's stdin and stdout. There is no
command per job: a job is a line on that channel.

connect(events), every wait bounded, every failure a HostUnreachable that says what to check, a
HostKeyError (hostkeys.py) or a ConfigError:
1. open the route (sshroute.py): the ssh config, jump hosts, host keys, TCP_NODELAY, keepalive;
2. ONE exec (within connect_timeout, as is opening its channel), `open_agent`:
       exec /bin/sh -c '[ -f AGENT ] || exit 75; command -v PYTHON || exit 127; echo READY;
                        exec PYTHON -S -E AGENT serve --spool SPOOL --host-name NAME --mode MODE'
   AGENT is AGENT_DIR/agent-<sha256 prefix>.py: copies go by content, so a host runs exactly the
   agent this controller ships. Only when that exits 75 (no such copy, or one of another size: cut
   short) is the agent copied, by one more exec (written to a temporary name, renamed once whole;
   AGENT_DIR made 0700: deploy_script), and the exec repeated.
   The READY line tells a started agent from a start that failed, before a byte of the protocol.
3. hello, within `timeout`. Only then are the channel's events passed on to `events`: those of a
   failed attempt are dropped (connect raises instead).

Invariants:
- No user text on a remote command line: the commands hold fixed words, the content hash and
  shell-quoted config values (python, spool, host name, mode); jobs travel as JSON on the channel.
  A path that starts with `~/` is resolved on the host ("$HOME"/...).
- The agent's stderr (tracebacks, warnings) is drained by a thread into `log_path` (else the logging
  module), so a chatty agent never stalls on a full SSH window.
- close() sends EOF: the agent exits and running jobs go on (they run under supervisors in their own
  sessions, never in the SSH session). The connection's loss does the same, and the channel reports
  HostLost once; `heartbeat=N` also catches a peer gone silent (see channel.py).
- SSH connections never cross a fork: a host connected in one process refuses to work in a forked
  child. Open connections in the process that uses them (the scheduler's pool is a forkserver).
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import secrets
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from xce_lite.errors import HostUnreachable
from xce_lite.exec.bundle import agent_copy
from xce_lite.exec.agentops import AgentOps
from xce_lite.exec.channel import DEFAULT_TIMEOUT, AgentChannel
from xce_lite.exec.host import EventSink, HostProbe
from xce_lite.exec.sshroute import Deadline, Route
from xce_lite.exec.sshtarget import SshTarget

__all__ = ["AGENT_MISSING", "SshHost", "SshTarget", "agent_copy", "probe", "remote_path"]

log = logging.getLogger(__name__)

AGENT_MISSING = 75  # the start command's exit status when the host has no copy of this agent
READY = "xce-agent-ready"  # the start command's first line once it has found the copy


def remote_path(path: str) -> str:
    """`path` as a word for the host's /bin/sh: `~` and `~/...` under the host's $HOME, the rest quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _sh(script: str) -> str:
    """A command line that runs `script` under /bin/sh, whatever the user's login shell is."""
    return "exec /bin/sh -c " + shlex.quote(script)


# ---------------------------------------------------------------- the agent's channel


class _StderrDrain:
    """Reads the agent's stderr until it ends: appended to `log_path` (else logged), the last lines
    kept for error messages."""

    def __init__(self, chan: paramiko.Channel, log_path: Path | None, name: str) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=10)
        self._chan, self._log_path, self._name = chan, log_path, name
        self._thread = threading.Thread(target=self._run, name=f"agent-stderr-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        out = None
        try:
            if self._log_path is not None:
                try:
                    out = open(self._log_path, "ab")
                except OSError as exc:
                    log.warning("host %s: cannot write the agent's log %s (%s); logging here instead",
                                self._name, self._log_path, exc.strerror)
            for line in iter(self._chan.makefile_stderr("rb").readline, b""):
                self.tail.append(line.decode("utf-8", "replace").rstrip())
                if out is not None:
                    out.write(line)
                    out.flush()
                else:
                    log.warning("host %s agent: %s", self._name, self.tail[-1])
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the channel is gone: nothing more to drain
        finally:
            if out is not None:
                out.close()

    def text(self, seconds: float) -> str:
        """The last lines, once the stream has ended (waiting up to `seconds` for it)."""
        self._thread.join(seconds)
        return " | ".join(self.tail)


@dataclass
class AgentStream:
    """The agent running on a channel of an open route: its stdout positioned past the ready line."""

    route: Route
    chan: paramiko.Channel
    rfile: object  # the channel's stdout, as a binary file
    drain: _StderrDrain
    deployed: bool  # the agent was copied to the host on the way

    def close(self) -> None:
        self.chan.close()
        self.route.close()


def open_agent(target: SshTarget, name: str, spool: str, mode: str, accept_new: bool,
               log_path: Path | None, records: str = "unit") -> AgentStream:
    """Open the route to `target` and start the agent on one channel of it (copying it first if
    the host has no copy of this one). Every wait is bounded; raises HostUnreachable, HostKeyError
    or ConfigError, having closed what it opened."""
    route = Route(target, accept_new)
    deadline = Deadline(route.close)
    try:
        route.open(deadline)
        return _start_agent(route, deadline, target, name, spool, mode, log_path, records)
    except BaseException:
        deadline.disarm()
        route.close()
        raise


def open_command(target: SshTarget, name: str, command: str, log_path: Path | None) -> AgentStream:
    """Open the route to `target` and run `command` (a remote command line: fixed words and quoted
    config values only) on one channel of it, its stderr drained into `log_path`: a relay to an
    agent elsewhere (a Slurm node's, through the login host: exec/slurmhost.py). Bounded as
    open_agent is; what the command says comes on the channel, hello first."""
    route = Route(target, accept_new=False)
    deadline = Deadline(route.close)
    try:
        route.open(deadline)
        chan = _exec(route, deadline, target, "starting the relay", command)
    except BaseException:
        deadline.disarm()
        route.close()
        raise
    return AgentStream(route, chan, None, _StderrDrain(chan, log_path, name), False)


def _start_agent(route: Route, deadline: Deadline, target: SshTarget, name: str, spool: str, mode: str,
                 log_path: Path | None, records: str = "unit") -> AgentStream:
    """The start command prints READY once it has found the copy (else it exits AGENT_MISSING, or
    127/126 when the host's python cannot run), then execs the agent on the same channel."""
    data, copy = agent_copy()
    agent = f"{remote_path(target.agent_dir)}/{copy}"
    # a copy of another size is as missing (copied again): a file cut short, which Python would refuse
    script = (f"a={agent}; [ -f \"$a\" ] && [ $(wc -c < \"$a\") -eq {len(data)} ] || exit {AGENT_MISSING}; "
              f"p={shlex.quote(target.python)}; "
              f"command -v \"$p\" >/dev/null || {{ echo \"$p: not found\" >&2; exit 127; }}; echo {READY}; "
              f"exec \"$p\" -S -E \"$a\" serve --spool {remote_path(spool)} --host-name {shlex.quote(name)} "
              f"--mode {shlex.quote(mode)} --records {shlex.quote(records)}")
    deployed = False
    while True:
        chan = _exec(route, deadline, target, "starting the agent", _sh(script))
        drain = _StderrDrain(chan, log_path, name)
        rfile = chan.makefile("rb")
        try:
            deadline.arm("starting the agent", target.connect_timeout)
            first = rfile.readline()
        except (OSError, EOFError, paramiko.SSHException):
            first = b""
        finally:
            deadline.disarm()
        if first.rstrip(b"\n") == READY.encode():
            return AgentStream(route, chan, rfile, drain, deployed)
        status = chan.exit_status if chan.status_event.wait(target.connect_timeout) else None
        chan.close()
        if status == AGENT_MISSING and not deployed:
            _deploy(route, deadline, target, name, data, copy)
            deployed = True
            continue
        raise _start_failed(route, target, name, status, drain, log_path)


def _exec(route: Route, deadline: Deadline, target: SshTarget, step: str, command: str) -> paramiko.Channel:
    t = target.connect_timeout
    where = route.where(route.links[-1])
    try:
        deadline.arm(f"opening a channel for {step}", t)
        chan = route.transport.open_session(timeout=t)
        deadline.arm(step, t)
        chan.exec_command(command)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        if deadline.expired:
            raise HostUnreachable(f"{where}: no answer within {t:g} s while {deadline.expired}; is the "
                                  "host overloaded?") from exc
        raise HostUnreachable(f"{where}: {step} failed: {exc or type(exc).__name__}; sshd may limit "
                              "sessions (MaxSessions) or commands there") from exc
    finally:
        deadline.disarm()
    return chan


def deploy_script(agent_dir: str, copy: str, size: int) -> str:
    """The host's side of copying the agent: its stdin to a temporary name, renamed to
    AGENT_DIR/copy only once all `size` bytes are there. A copy cut short (the controller killed, or
    the connection lost, mid-copy: `cat` sees an end of input either way) is never put in place,
    where every later start would run it and fail. The temporary name ends in a token drawn here,
    not the shell's $$: hosts that share a home (NFS; test hosts in PID namespaces) may copy at the
    same moment with the same pid, and one's `cat >` would truncate the other's file."""
    t = f"\"$d/.{copy}.{secrets.token_hex(8)}\""
    return (f"umask 077; d={remote_path(agent_dir)}; mkdir -p \"$d\" && chmod 700 \"$d\" && cat > {t} "
            f"|| {{ rm -f {t}; exit 1; }}; n=$(wc -c < {t}); [ $n -eq {size} ] || {{ rm -f {t}; "
            f"echo \"only $n of {size} bytes came\" >&2; exit 1; }}; "
            f"mv -f {t} \"$d/{copy}\" || {{ rm -f {t}; exit 1; }}")


def _deploy(route: Route, deadline: Deadline, target: SshTarget, name: str, data: bytes, copy: str) -> None:
    """Copy the agent to AGENT_DIR/copy (deploy_script)."""
    chan = _exec(route, deadline, target, "copying the agent", _sh(deploy_script(target.agent_dir, copy, len(data))))
    try:
        deadline.arm("copying the agent", target.connect_timeout)
        chan.sendall(data)
        chan.shutdown_write()
        status = chan.recv_exit_status()
        error = chan.makefile_stderr("rb").read().decode("utf-8", "replace").strip()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        status, error = None, str(exc) or type(exc).__name__
    finally:
        deadline.disarm()
        chan.close()
    if status != 0:
        raise HostUnreachable(f"host {name}: cannot copy the agent to {target.agent_dir} there "
                              f"({error or f'exit status {status}'}); check the disk and the "
                              "directory's permissions, or set another agent directory")


def _start_failed(route: Route, target: SshTarget, name: str, status: int | None, drain: _StderrDrain,
                  log_path: Path | None) -> HostUnreachable:
    stderr = drain.text(1.0)
    python = target.python
    if status == 127:
        return HostUnreachable(f"host {name}: {python} not found there ({stderr or 'not on the PATH'}); "
                               "install Python 3 or set the host's `python`")
    if status == 126:
        return HostUnreachable(f"host {name}: {python} cannot be run there ({stderr}); set the host's "
                               "`python` to a Python 3 interpreter")
    detail = f" (exit status {status})" if status is not None else ""
    logs = f"; see {log_path}" if log_path else ""
    return HostUnreachable(f"{route.where(route.links[-1])}: the agent did not start{detail}"
                           f"{': ' + stderr if stderr else ''}{logs}")


class SshHost(AgentOps):
    """A machine over SSH as a Host, in this process. See the module docstring; the ops are
    AgentOps'. (The controller uses sshgate.GatewayHost, which runs the same connection in the SSH
    gateway process, so that the controller never loads paramiko.)

    `spool` is the agent's directory on the host (`~/` is the host's home), `mode` is passed to the
    agent (`--mode`: auto, systemd, user, plain), `timeout` bounds each request and the hello.
    `heartbeat=N`: a ping every N s, and the channel is lost when one is not answered within
    `timeout`. `accept_new`: trust an unknown host key and append it to target.accepted_keys (a
    changed key is refused all the same). `log_path`: where the agent's stderr goes.
    """

    def __init__(
        self,
        name: str,
        target: SshTarget,
        spool: str,
        mode: str = "auto",
        timeout: float = DEFAULT_TIMEOUT,
        heartbeat: float | None = None,
        accept_new: bool = False,
        log_path: str | os.PathLike | None = None,
        records: str = "unit",
    ) -> None:
        self.name, self.target, self.spool, self.mode, self.records = name, target, spool, mode, records
        self.timeout, self.heartbeat, self.accept_new = timeout, heartbeat, accept_new
        self.log_path = Path(log_path) if log_path is not None else None
        self.deployed = False  # whether the last connect() copied the agent to the host
        self.agent_pid: int | None = None  # the agent's pid on the host (in its pid namespace)
        self._stream: AgentStream | None = None
        self._pid = os.getpid()  # the process that opened the connection: the only one that may use it
        self._channel: AgentChannel | None = None

    def _chan(self) -> AgentChannel:
        if self._stream is not None and self._pid != os.getpid():
            raise HostUnreachable(f"host {self.name}: its SSH connection was opened by process "
                                  f"{self._pid}, and SSH connections do not survive fork; connect "
                                  "in the process that uses the host")
        return super()._chan()

    def connect(self, events: EventSink) -> HostProbe:
        """Open the route, start (or first copy) the agent and greet it. A previous connection of
        this host is closed first. Raises HostUnreachable, HostKeyError or ConfigError."""
        self.close()
        stream = open_agent(self.target, self.name, self.spool, self.mode, self.accept_new, self.log_path,
                            self.records)
        self._stream, self._pid, self.deployed = stream, os.getpid(), stream.deployed
        hello = self._greet(stream.rfile, stream.chan.makefile_stdin("wb"), events, self.timeout, self.heartbeat)
        self.agent_pid = hello.extra.get("pid")
        return hello

    def close(self) -> None:
        """Send the agent EOF (it exits; running jobs go on) and close the connection."""
        stream, channel, self._stream, self._channel = self._stream, self._channel, None, None
        if stream is None or self._pid != os.getpid():
            return  # never touch a parent's connection from a forked child
        if channel is not None:
            channel.close(0.0 if channel.lost else 10.0)
        stream.close()


def probe(target: SshTarget, spool: str, mode: str = "auto", accept_new: bool = False,
          timeout: float = DEFAULT_TIMEOUT, log_path: str | os.PathLike | None = None) -> HostProbe:
    """Connect, greet the agent and close: what `xce hosts add NAME` shows (and, with accept_new,
    the host key it trusts from now on)."""
    host = SshHost(target.name, target, spool, mode=mode, timeout=timeout, accept_new=accept_new,
                   log_path=log_path)
    try:
        return host.connect(queue.Queue())
    finally:
        host.close()
