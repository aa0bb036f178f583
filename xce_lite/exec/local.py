"""LocalHost: the Host seam (host.py) for this machine.

Runs the agent as a child process (`python -S -E agent-<hash>.py serve --spool SPOOL --host-name
NAME --mode MODE`: the one file bundle.py builds from exec/agent/, written beside the spool, named
by its content) and speaks to it through an AgentChannel over the child's stdin/stdout pipes. What
it keeps:

- The agent runs in its own session (start_new_session), so a Ctrl-C in the controller's terminal
  does not reach it or the jobs; jobs run in their supervisors' sessions anyway.
- The agent's stderr (tracebacks, warnings) is appended to SPOOL/../agent-NAME.log.
- close() closes the agent's stdin; the agent exits on that EOF and running jobs go on (under a
  lease with jobs running, it stays to enforce the lease, its output closed: it is left alone). If
  the controller dies instead, the pipe closes all the same.
- One agent per spool: a second LocalHost on the same spool waits for the first agent's lock
  (`lock_timeout`), then connect() raises HostUnreachable saying so.
- `mode` is how the agent runs jobs (auto, systemd, user or plain: docs/agent-protocol.md); `auto`
  picks systemd units where this machine can (root, systemd as PID 1), else the plain supervisor.
  The probe's `extra` says which it uses (`mode`) and why not the others (`modes`).
- The agent's journal records every unit (exec/agent/journal.py): supervisor_pids() reads the
  supervisors that still run from it, for clean-up in tests and benchmarks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from xce_lite.errors import HostUnreachable
from xce_lite.exec import bundle
from xce_lite.exec.agent.journal import read_journal
from xce_lite.exec.agent.util import boot_id, is_alive
from xce_lite.exec.agentops import AgentOps
from xce_lite.exec.channel import DEFAULT_TIMEOUT, AgentChannel
from xce_lite.exec.host import EventSink, HostProbe


def supervisor_pids(spool_dir: str | os.PathLike) -> list[int]:
    """The pids of the supervisors that SPOOL_DIR's journal records and that still run a unit
    (checked against their /proc start time and this boot): their unit has no result yet. (A
    reused supervisor, exec/agent/pool.py, lives on after its unit's result, for the next one;
    it has stopped that unit's processes before it recorded the result.) Read-only: for clean-up
    in tests and benchmarks; the agent itself is the only judge of a unit's state."""
    boot = boot_id()
    return [
        u.pid
        for u in read_journal(os.fspath(spool_dir)).values()
        if u.pid is not None and u.result is None and u.boot == boot and is_alive(u.pid, u.starttime)
    ]


class LocalHost(AgentOps):
    """This machine as a Host. See the module docstring; the ops are AgentOps'."""

    def __init__(
        self,
        name: str,
        spool_dir: str | os.PathLike,
        python: str = sys.executable,
        timeout: float = DEFAULT_TIMEOUT,
        lock_timeout: float = 10.0,
        mode: str = "auto",
        records: str = "unit",
    ) -> None:
        self.name = name
        self.spool_dir = Path(spool_dir).absolute()
        self.python, self.timeout, self.lock_timeout, self.mode = python, timeout, lock_timeout, mode
        self.records = records  # who records a systemd unit's end: its stop command ("unit") or the agent
        self._proc: subprocess.Popen | None = None
        self._channel: AgentChannel | None = None

    @property
    def log_path(self) -> Path:
        return self.spool_dir.parent / f"agent-{self.name}.log"

    @property
    def agent_pid(self) -> int | None:
        """The running agent's pid (for diagnostics and tests), or None when not connected."""
        return self._proc.pid if self._proc is not None else None

    def agent_argv(self) -> list[str]:
        """The command whose stdin and stdout are the agent's: here the agent itself, installed
        beside the spool. A subclass reaches an agent elsewhere (exec/slurmhost.py: a relay)."""
        self.spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            agent = bundle.install(self.spool_dir.parent, mode=0o600)
        except OSError as exc:
            raise HostUnreachable(
                f"host {self.name}: cannot write the agent into {self.spool_dir.parent}: {exc.strerror}; "
                "check the disk and the directory's permissions"
            ) from exc
        return [
            self.python,
            "-S",
            "-E",
            str(agent),
            "serve",
            "--spool",
            str(self.spool_dir),
            "--host-name",
            self.name,
            "--lock-timeout",
            str(self.lock_timeout),
            "--mode",
            self.mode,
            "--records",
            self.records,
        ]

    def connect(self, events: EventSink) -> HostProbe:
        """Start the agent and greet it. A previous agent of this LocalHost is closed first."""
        self.close()
        argv = self.agent_argv()
        with open(self.log_path, "ab", opener=_private) as log:
            try:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise HostUnreachable(
                    f"host {self.name}: cannot start {self.python}: {exc.strerror}; check the python path"
                ) from exc
        assert self._proc.stdout is not None and self._proc.stdin is not None  # both are pipes
        self._channel = AgentChannel(self._proc.stdout, self._proc.stdin, events.put, self.name, self.timeout)
        try:
            return self.probe()
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        """Close the agent's stdin and wait for its output to end (it exits on EOF, or stays to
        enforce its lease on running jobs, with its output closed); running jobs go on."""
        proc, channel = self._proc, self._channel
        self._proc = self._channel = None
        if channel is not None:
            channel.close()
        if proc is None:
            return
        if channel is not None and channel.join(0):
            try:
                proc.wait(timeout=1)  # exiting (reaped here), or an orphan that outlives us: left alone
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout is not None:
                proc.stdout.close()
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a hung agent: it is ours, end it (its jobs go on)
            proc.kill()
            proc.wait()
        if channel is not None and channel.join(10) and proc.stdout is not None:
            proc.stdout.close()


def _private(path: str, flags: int) -> int:
    """open()'s opener for the agent's log: made 0600, as everything in the cluster home."""
    return os.open(path, flags, 0o600)
