"""SlurmHost: the Host seam (host.py) for one node of a Slurm allocation.

The agent runs in the allocation's batch step, started by its keeper (exec/agent/keeper.py) for
each connection; this side starts a relay to it (`srun --overlap --jobid=ID`, exec/slurm.py) and
speaks the agent's protocol over the relay's pipes, exactly as LocalHost does over the agent's own.
With `direct`, the
relay is a TCP connection to the keeper instead (TCP_NODELAY; see exec/agent/keeper.py for why).
With `via` (a pool's login host), the same srun runs there, in a login shell, on an SSH channel
the SSH gateway holds (sshgate.py op "stream"), pinged like a direct connection.
Closing the relay, or losing it (a controller crash kills it with the controller), makes that
agent exit and leaves the jobs running under the keeper; the next connect() starts a new relay and
a new agent, which adopts them from the spool's journal.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import replace

from xce_lite.exec import slurm
from xce_lite.exec.channel import DEFAULT_TIMEOUT
from xce_lite.errors import HostUnreachable
from xce_lite.exec.agent.journal import read_journal
from xce_lite.exec.agent.keeper import TCP_FILE
from xce_lite.exec.channel import result_from_json
from xce_lite.exec.host import EventSink, HostProbe, JobResult, LaunchReply, LaunchRequest
from xce_lite.exec.local import LocalHost
from xce_lite.exec.sshtarget import SshTarget


HEARTBEAT = 15.0  # seconds between pings on a direct connection: a silent node is noticed


class SlurmHost(LocalHost):
    """Node `node` of allocation `job_id`, whose files are in DIRECTORY/JOB_ID/NODE (see
    exec/slurm.py). `agent_file` is the agent's file as the node sees it (a shared file system);
    `python` the node's interpreter. Every op is LocalHost's (AgentOps')."""

    def __init__(
        self,
        name: str,
        job_id: str,
        node: str,
        directory: str | os.PathLike,
        agent_file: str | os.PathLike,
        python: str = sys.executable,
        timeout: float = DEFAULT_TIMEOUT,
        nodelist: str | None = None,
        direct: bool = False,
        via: SshTarget | None = None,
    ) -> None:
        node_dir = os.path.join(os.fspath(directory), str(job_id), node)
        super().__init__(name, os.path.join(node_dir, "spool"), python=python, timeout=timeout, mode="plain")
        self.job_id, self.node, self.directory = str(job_id), node, os.fspath(directory)
        self.agent_file = os.fspath(agent_file)
        self.nodelist = nodelist  # the allocation's nodes, as Slurm writes them (SLURM_JOB_NODELIST)
        self.direct = direct  # connect to the keeper's TCP port (k.tcp), not through srun
        self.via = via  # the login host the srun relay runs on (None: this machine)
        self._sock: socket.socket | None = None

    @property
    def log_path(self):
        """The relay's stderr (srun's words, the relay's); the agent's own log is the keeper's agent.log."""
        return self.spool_dir.parent / "relay.log"

    def agent_argv(self) -> list[str]:
        # the node's directory may not be there yet (the batch script makes it): the relay's log goes there
        self.spool_dir.parent.mkdir(parents=True, exist_ok=True)
        return slurm.relay_argv(self.job_id, self.node, self.directory, self.python, self.agent_file)

    @property
    def agent_pid(self) -> int | None:
        return None if self.direct or self.via is not None else super().agent_pid

    def connect(self, events: EventSink) -> HostProbe:
        """Through `srun` (LocalHost's way, over the relay's pipes), or straight to the keeper's TCP
        port with TCP_NODELAY when `direct` (HostUnreachable, saying why, until the keeper is up)."""
        if not self.direct and self.via is None:
            return super().connect(events)
        self.close()
        if not self.direct:
            return self._connect_via(events)
        path = self.spool_dir.parent / TCP_FILE
        try:
            host, port, token = path.read_text().split()
        except (OSError, ValueError):
            raise HostUnreachable(f"host {self.name}: no keeper's address in {path} yet; is allocation "
                                  f"{self.job_id} running, with `connect: direct`?") from None
        try:
            sock = socket.create_connection((host, int(port)), timeout=self.timeout)
        except OSError as exc:
            raise HostUnreachable(f"host {self.name}: cannot reach the keeper at {host}:{port}: {exc}; can "
                                  "this machine reach the nodes' ports? else use `connect: srun`") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        sock.sendall(token.encode() + b"\n")
        self._sock = sock
        return self._greet(sock.makefile("rb"), sock.makefile("wb"), events, self.timeout, HEARTBEAT)

    def _connect_via(self, events: EventSink) -> HostProbe:
        """The srun relay on the login host `via`, over a channel of the SSH gateway's."""
        from xce_lite.exec.sshgate import open_channel

        via = self.via
        assert via is not None  # connect() comes here only for a pool with a login host
        command = slurm.login_command(self.agent_argv())
        _reply, ours = open_channel({"op": "stream", "name": self.name, "target": via.to_json(),
                                     "command": command, "log_path": str(self.log_path)})
        self._sock = ours
        try:
            return self._greet(ours.makefile("rb"), ours.makefile("wb"), events, self.timeout, HEARTBEAT)
        except HostUnreachable as exc:
            raise HostUnreachable(f"{exc}; srun's words, through {via.name}, are in {self.log_path}") from None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            super().close()
            return
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        try:
            sock.shutdown(socket.SHUT_WR)  # the agent reads EOF and exits; the jobs go on
        except OSError:
            pass
        if channel is not None and not channel.join(10):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def _with_allocation(self, requests: list[LaunchRequest]) -> list[LaunchRequest]:
        """Jobs here see their allocation as a Slurm batch job would (SLURM_JOB_ID, SLURM_JOB_NODELIST)."""
        extra = {"SLURM_JOB_ID": self.job_id, "SLURM_JOB_NODELIST": self.nodelist or self.node}
        return [replace(r, env={**r.env, **extra}) for r in requests]

    def launch(self, requests: list[LaunchRequest], timeout: float | None = None) -> list[LaunchReply]:
        return super().launch(self._with_allocation(requests), timeout)

    def launch_nowait(self, requests: list[LaunchRequest]) -> None:
        super().launch_nowait(self._with_allocation(requests))


def results_on_disk(directory: str | os.PathLike, job_id: str, node: str) -> dict[str, JobResult]:
    """The results the journal of node `node` of allocation `job_id` holds, by unit: read from the
    file system the nodes share with the controller, for an allocation whose end took its relay
    (and the agent's last reports over it) down with it. A torn or missing journal gives what it can."""
    spool = os.path.join(os.fspath(directory), str(job_id), node, "spool")
    try:
        units = read_journal(spool)
    except OSError:
        return {}
    out = {}
    for name, unit in units.items():
        if unit.result is not None:
            try:
                out[name] = result_from_json(unit.result)
            except (KeyError, TypeError):
                continue
    return out
