"""The cipher an SSH host's connection agrees on (exec/sshroute.py, CIPHERS): AES-GCM with an
OpenSSH server, which costs the gateway less CPU per agent line than paramiko's default AES-CTR
with a MAC computed in Python; and a server without GCM still gets a working connection.

Real sshd on a real plain test host; the GCM-less server is that same host's sshd, run by the
ProxyCommand in inetd mode inside the host with its cipher list cut down.
"""

from __future__ import annotations

import queue

from tests.support.agent_hosts import ssh_target
from xce_lite.exec.ssh import SshHost
from xce_lite.testhosts import TestHost
from xce_lite.testhosts.base import SSHD


def negotiated(host: SshHost) -> tuple[str, str]:
    transport = host._stream.route.transport  # the connection the agent's channel runs on
    return transport.local_cipher, transport.remote_cipher


def test_an_openssh_host_is_spoken_to_with_aes_gcm(plain_hosts, workdir):
    host = SshHost("host1", ssh_target(plain_hosts[0], workdir), str(workdir / "spool"))
    assert host.connect(queue.Queue()).hostname == "host1"
    try:
        assert negotiated(host) == ("aes128-gcm@openssh.com", "aes128-gcm@openssh.com")
        for _ in range(50):  # lines both ways on the agent's channel, under that cipher
            host.ping()
        assert host.list_units() == []
    finally:
        host.close()


def test_a_server_without_gcm_still_connects_with_the_next_cipher(plain_hosts, workdir):
    test_host: TestHost = plain_hosts[0]
    sshd_config = test_host.ssh_config_path.parent / "sshd_config"
    proxy = (f"nsenter -t {test_host.pid} -a {SSHD} -i -f {sshd_config} -o Ciphers=aes256-ctr,aes128-ctr "
             "-o LogLevel=QUIET")
    config = workdir / "ssh_config"
    config.write_text(f"Host host1\n  ProxyCommand {proxy}\n\n" + test_host.ssh_config_path.read_text())
    host = SshHost("host1", ssh_target(test_host, workdir, ssh_config=str(config)), str(workdir / "spool"))
    assert host.connect(queue.Queue()).hostname == "host1"
    try:
        assert negotiated(host) == ("aes128-ctr", "aes128-ctr")  # paramiko's own first choice, as before
        assert host.ping() > 0
        assert host.list_units() == []
    finally:
        host.close()
