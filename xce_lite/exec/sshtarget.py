"""How to reach an ssh host, as plain values: no paramiko here, so the controller can hold and send
these without loading the SSH stack (which lives in the SSH gateway process, sshgate.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SshTarget:
    """How to reach one host: plain values (built from config.HostConfig and config.SshConfig).

    None means "as the ssh config says" (then: the name, port 22, the local user, paramiko's default
    keys and ssh-agent). `name` is the host's name in the cluster and its Host entry in the ssh config.
    """

    name: str
    address: str | None = None
    port: int | None = None
    user: str | None = None
    identity: str | None = None  # a private key file, tried before the ssh config's IdentityFile
    ssh_config: str | None = "~/.ssh/config"  # None, or a missing file: no ssh config
    known_hosts: tuple[str, ...] = ("~/.ssh/known_hosts",)  # trusted, never written
    accepted_keys: str | None = None  # trusted too; where accept_new writes (e.g. <home>/known_hosts)
    connect_timeout: float = 10.0  # seconds for each step of connecting
    keepalive: float = 15.0  # seconds between keepalives on an idle connection
    python: str = "python3"  # the host's Python 3
    agent_dir: str = "~/.xce-agent"  # where the host keeps the agent's copies (by content hash)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> SshTarget:
        return cls(**{**data, "known_hosts": tuple(data.get("known_hosts") or ())})
