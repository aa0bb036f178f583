"""The connections that lead to an SSH host: its route through the user's ssh config and jump hosts,
each connection's host key checked, every wait bounded, every library error translated.

`Route(target, accept_new)` resolves the SshTarget through the ssh config (HostName, Port, User,
IdentityFile, IdentitiesOnly, ProxyJump, ProxyCommand; the target's own fields win) into fabric
Connections, jump hosts first. `open(deadline)` opens them in order, each through the previous one
(a direct-tcpip channel: ProxyJump in OpenSSH's order, which fabric 3 reverses for several hops):

- TCP connect, banner, key exchange and auth each within connect_timeout (paramiko's own deadlines),
  a Deadline over the whole as a safety net, and over each jump host's tunnel;
- the host key judged by hostkeys.KnownHostsPolicy against the target's known_hosts files, the
  connection's own UserKnownHostsFile and the accepted-keys file; fabric's and invoke's own config
  files are not read (lazy config), so nothing there can turn that check off;
- TCP_NODELAY on each socket (a request is a few hundred bytes: Nagle would hold it back) and
  transport keepalive;
- AES-GCM offered first (CIPHERS): an agent's lines are small packets, and paramiko's default,
  AES-CTR with HMAC-SHA2 in Python, costs ~20% more client CPU per round trip; a server without GCM
  (OpenSSH has it since 6.2) still agrees on the next cipher of paramiko's own list.

Failures come out as HostUnreachable saying what to check (refused: is sshd running; auth: the
identity file; timeouts: which step), HostKeyUnknown/HostKeyChanged, or ConfigError.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import subprocess
import threading
from typing import Any

import fabric
import paramiko
from paramiko.config import SSHConfig

from xce_lite.errors import ConfigError, HostKeyError, HostUnreachable, XceError
from xce_lite.exec.hostkeys import KnownHosts, KnownHostsPolicy, key_name, no_listed_type_error
from xce_lite.exec.sshtarget import SshTarget

log = logging.getLogger(__name__)
# paramiko logs each failed handshake with its traceback, which Python's last-resort handler would
# print where no logging is set up (the CLI); the errors are translated here and say it better.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

MAX_JUMPS = 8  # ProxyJump hops that may lead to one host (a loop in the ssh config ends here)

# The ciphers offered, in order: the AEAD ones first (one pass, no separate MAC), then paramiko's
# own list as it stands, so a server that lacks them negotiates exactly what it did before.
GCM = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_DEFAULT: tuple[str, ...] = getattr(paramiko.Transport, "_preferred_ciphers", ())
CIPHERS = tuple(c for c in GCM if c in _DEFAULT) + tuple(c for c in _DEFAULT if c not in GCM)
# SSHClient.connect takes a transport_factory since paramiko 3.2; an older one offers its own list.
_FACTORY = bool(CIPHERS) and "transport_factory" in inspect.signature(paramiko.SSHClient.connect).parameters


def _transport(sock: Any, **options: Any) -> paramiko.Transport:
    """paramiko's Transport offering CIPHERS (SSHClient.connect's transport_factory)."""
    t = paramiko.Transport(sock, **options)
    t.get_security_options().ciphers = CIPHERS
    return t


class Deadline:
    """A watchdog for the waits paramiko leaves unbounded (exec, jump channels): when the armed step
    takes too long it closes the route, which fails the wait, and remembers which step it was."""

    def __init__(self, close) -> None:
        self._close = close
        self._timer: threading.Timer | None = None
        self.expired: str | None = None
        self.seconds = 0.0

    def arm(self, step: str, seconds: float) -> None:
        self.disarm()
        self.seconds = seconds
        self._timer = timer = threading.Timer(seconds, self._fire, (step,))
        timer.daemon = True
        timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, step: str) -> None:
        self.expired = step
        self._close()


class Route:
    """The connections that lead to the target: jump hosts first, in order, the target last."""

    def __init__(self, target: SshTarget, accept_new: bool) -> None:
        self.target, self.accept_new = target, accept_new
        config = SSHConfig()
        path = os.path.expanduser(target.ssh_config) if target.ssh_config else None
        if path and os.path.isfile(path):
            try:
                config = SSHConfig.from_path(path)
            except (OSError, ValueError, paramiko.SSHException) as exc:
                raise ConfigError(f"cannot read the ssh config {path}: {exc}; fix it or set ssh.config") from exc
        self._config = fabric.Config(ssh_config=config, lazy=True)  # lazy: no fabric/invoke files
        identity = os.path.expanduser(target.identity) if target.identity else None
        if identity and not os.path.isfile(identity):
            raise ConfigError(f"host {target.name}: identity file {identity} does not exist; check the "
                              "host's `identity`")
        final = self._make(target.name, user=target.user, port=target.port, identity=identity)
        if target.address:
            final.host = target.address
        self.links = self._links_to(final, 0)
        self.labels = {id(c): f"jump host {c.original_host}" for c in self.links[:-1]}
        self.labels[id(final)] = target.name

    def _make(self, spec: str, user: str | None = None, port: int | None = None,
              identity: str | None = None) -> fabric.Connection:
        t = self.target.connect_timeout
        kwargs: dict[str, Any] = {"timeout": t, "banner_timeout": t, "auth_timeout": t, "channel_timeout": t}
        if identity:
            kwargs["key_filename"] = [identity]
        # gateway=False: this class opens jump hosts itself (see _links_to and open)
        c = fabric.Connection(spec, user=user, port=port, config=self._config, gateway=False,
                              connect_kwargs=kwargs)
        c.connect_timeout = None  # fabric truncates it to whole seconds; `timeout` above is exact
        if c.ssh_config.get("identitiesonly", "no").lower() == "yes":
            c.connect_kwargs.update(allow_agent=False, look_for_keys=False)
        return c

    def _links_to(self, c: fabric.Connection, depth: int) -> list[fabric.Connection]:
        jump = c.ssh_config.get("proxyjump", "none")
        if jump.lower() == "none":
            command = c.ssh_config.get("proxycommand", "none")
            if command.lower() != "none":
                c.gateway = command  # fabric runs it and speaks over its stdin/stdout
            return [c]
        if depth >= MAX_JUMPS:
            raise ConfigError(f"host {self.target.name}: more than {MAX_JUMPS} ProxyJump hops; look for a "
                              "loop in the ssh config")
        hops = [h.strip() for h in jump.split(",") if h.strip()]
        return [*self._links_to(self._make(hops[0]), depth + 1), *(self._make(h) for h in hops[1:]), c]

    @property
    def transport(self) -> paramiko.Transport:
        return self.links[-1].transport

    def where(self, c: fabric.Connection) -> str:
        label = self.labels[id(c)]
        via = "" if label == self.target.name else f" ({label} of {self.target.name})"
        return f"{c.user}@{c.host}:{c.port}{via}"

    def open(self, deadline: Deadline) -> None:
        """Open each connection in order, each jump host's tunnel within connect_timeout."""
        t = self.target.connect_timeout
        previous = None
        for c in self.links:
            try:
                if previous is not None:
                    deadline.arm(f"opening a tunnel through {self.where(previous)}", t)
                    c.connect_kwargs["sock"] = previous.transport.open_channel(
                        "direct-tcpip", (c.host, int(c.port)), ("", 0), timeout=t)
                self._open_one(c, deadline)
            except Exception as exc:
                deadline.disarm()
                raise self._translate(exc, c, deadline) from exc
            previous = c
        deadline.disarm()

    def _open_one(self, c: fabric.Connection, deadline: Deadline) -> None:
        name = key_name(c.host, int(c.port))
        known = KnownHosts([*self.target.known_hosts, *c.ssh_config.get("userknownhostsfile", "").split()],
                           self.target.accepted_keys)
        restricted = known.restricted_algorithms(name)
        if restricted:
            c.connect_kwargs["disabled_algorithms"] = {"keys": restricted}
        if _FACTORY:
            c.connect_kwargs["transport_factory"] = _transport
        c.client.set_missing_host_key_policy(
            KnownHostsPolicy(known, self.labels[id(c)], self.target.name, self.accept_new))
        # a safety net over paramiko's own deadlines (TCP, banner, key exchange, auth: t each)
        deadline.arm(f"connecting to {self.where(c)}", 4 * self.target.connect_timeout + 1)
        try:
            c.open()
        except paramiko.ssh_exception.IncompatiblePeer as exc:
            if restricted and "host key" in str(exc):
                raise no_listed_type_error(known, self.labels[id(c)], self.target.name, name) from exc
            raise
        sock = c.transport.sock
        if isinstance(sock, socket.socket):  # a jump host's tunnel is a channel: its socket has it
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.transport.set_keepalive(max(1, round(self.target.keepalive)))

    def _translate(self, exc: Exception, c: fabric.Connection, deadline: Deadline) -> XceError:
        if isinstance(exc, (HostKeyError, ConfigError)):
            return exc
        where, t = self.where(c), self.target.connect_timeout
        address = f"{c.host}:{c.port}"
        if deadline.expired:
            return HostUnreachable(f"{where}: no answer within {deadline.seconds:g} s while {deadline.expired}; "
                                   "is the host overloaded, or the network losing packets?")
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
            exc = next(iter(exc.errors.values()))
        if isinstance(exc, paramiko.AuthenticationException):
            keys = ", ".join(c.connect_kwargs.get("key_filename") or []) or "your default keys and ssh-agent"
            return HostUnreachable(f"authentication failed for {where}: check the identity file ({keys}) and "
                                   "that its public key is in the host's ~/.ssh/authorized_keys")
        if isinstance(exc, ConnectionRefusedError):
            return HostUnreachable(f"connection refused on {address}: is sshd running there, on that port?")
        if isinstance(exc, TimeoutError):
            return HostUnreachable(f"no answer from {address} within {t:g} s ({where}): is the host up and "
                                   "its address right?")
        if isinstance(exc, socket.gaierror):
            return HostUnreachable(f"cannot resolve {c.host!r} ({where}): check the host's address, or its "
                                   "HostName in the ssh config")
        if isinstance(exc, FileNotFoundError) and exc.filename:
            return ConfigError(f"{where}: the identity file {exc.filename} does not exist; check the host's "
                               "`identity` or IdentityFile in the ssh config")
        # paramiko's key exchange ends at its deadline without an error of its own: the next step
        # then finds "No existing session"
        if isinstance(exc, paramiko.SSHException) and any(
                words in str(exc) for words in ("banner", "No existing session", "Negotiation timed out")):
            return HostUnreachable(f"no SSH handshake with {address} within {t:g} s ({where}): is that port "
                                   "an SSH server? (sshd's MaxStartups may be turning connections away)")
        if isinstance(exc, (paramiko.SSHException, EOFError)):
            return HostUnreachable(f"SSH with {where} failed: {exc or type(exc).__name__}; check sshd's log "
                                   "on that host")
        if isinstance(exc, OSError):
            return HostUnreachable(f"cannot reach {address} ({where}): {exc.strerror or exc}")
        raise exc

    def close(self) -> None:
        """Close every connection, opened or half opened, and end the ProxyCommands they ran."""
        for c in reversed(self.links):
            transport = c.client.get_transport()
            try:
                c.close()
                if transport is not None:
                    transport.close()  # fabric leaves one alone that failed before it was connected
            except Exception:  # closing is best effort: the connection may be half dead
                log.debug("closing %s", self.where(c), exc_info=True)
            if transport is not None and isinstance(transport.sock, paramiko.ProxyCommand):
                if transport.is_alive() and transport is not threading.current_thread():
                    transport.join(5)  # its last act closes the ProxyCommand (SIGTERM) once more
                _reap(transport.sock.process)


def _reap(process: subprocess.Popen) -> None:
    """End a ProxyCommand: paramiko's close() only sends it SIGTERM, leaving a zombie and its pipes."""
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
