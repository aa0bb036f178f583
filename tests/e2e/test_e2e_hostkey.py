"""End to end: a host whose SSH host key changes while the controller runs (it was reinstalled, or
someone is in the middle), through the real controller, a real sshd and the real CLI.

The host is a plain test host of this test's own: its sshd (listener and sessions) is killed, its
host key regenerated, and its sshd started again. The controller must say so at once, in
`xce hosts -l` and in its log, with the new fingerprint and the way to accept it, and accept
nothing by itself; once a person has removed the old line and accepted the new key, the host is
back and runs jobs.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import uuid

import pytest

from tests.support.cluster import hosts_of
from tests.support.remote import close, remote_config, sshd_pids, started_cluster
from tests.support.waiting import wait_until
from xce_lite import testhosts
from xce_lite.exec.hostkeys import fingerprint


@pytest.fixture
def own_host(require_testhosts, testhosts_root):
    require_testhosts(plain=True)
    d = testhosts_root / f"own-k-{uuid.uuid4().hex[:6]}"
    try:
        yield testhosts.up(1, d, plain=True, die_with_caller=True, prefix="k")[0]
    finally:
        testhosts.down(d)


def new_host_key(host: testhosts.TestHost) -> str:
    """Replace the host's key with a new one (its sshd reads it when started); its SHA256 fingerprint."""
    for suffix in ("", ".pub"):
        (host.dir / f"hostkey{suffix}").unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "xce-testhosts", "-f",
                    str(host.dir / "hostkey")], check=True, stdin=subprocess.DEVNULL, timeout=30)
    return fingerprint(base64.b64decode(host.host_key_path.read_text().split()[1]))


def test_a_host_key_changed_while_the_controller_runs_is_reported_at_once_and_never_accepted(
        own_host, testhosts_root):
    host = own_host
    c = started_cluster(remote_config([host], keepalive="1s"), testhosts_root)
    try:
        wait_until(lambda: hosts_of(c)[host.name]["state"] == "ok", 60, "the host up")
        known_before = host.known_hosts_path.read_bytes()
        new = new_host_key(host)
        for pid in sshd_pids(host):  # the listener and the controller's session: the host is away
            os.kill(pid, signal.SIGKILL)
        subprocess.run(host.nsenter_argv(testhosts._sshd_argv(host.dir, host.ip)), check=True, timeout=30)

        def reported() -> str | None:
            text = c.ok("hosts", "-l")
            return text if "HOST KEY CHANGED" in text else None

        text = wait_until(reported, 30, "xce hosts -l to report the changed key")
        assert new in text and f"xce hosts add {host.name} --accept-new" in text and "ssh-keygen -R" in text
        log = (c.home / "controller.log").read_text()
        assert f"host {host.name} is unreachable: HOST KEY CHANGED" in log and new in log
        assert hosts_of(c)[host.name]["state"] == "unreach"
        assert host.known_hosts_path.read_bytes() == known_before  # nothing accepted
        assert not (c.home / "known_hosts").exists() or new not in (c.home / "known_hosts").read_text()

        # a person who knows why: removes the old line, accepts the new key; the host is back
        subprocess.run(["ssh-keygen", "-q", "-R", host.ip, "-f", str(host.known_hosts_path)], check=True,
                       capture_output=True, timeout=30)
        accepted = c.xce("hosts", "add", host.name, "--accept-new")
        assert accepted.returncode == 0, accepted.stderr
        wait_until(lambda: hosts_of(c)[host.name]["state"] == "ok", 30, "the host back with its new key")
        job_id = c.submit("hostname")
        assert c.xce("wait", str(job_id)).returncode == 0
    finally:
        close(c)
