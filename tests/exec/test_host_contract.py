"""The Host contract (host_contract.py) against every real implementation: LocalHost on this
machine, SshHost to a systemd test host and SshHost to a plain test host (real sshd, real agent)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.support.agent_hosts import ssh_target
from tests.support.agent_local import kill_leftovers
from tests.support.host_contract import HostContract, HostRig
from xce_lite.exec.local import LocalHost
from xce_lite.exec.ssh import SshHost

_runs = itertools.count()


@pytest.fixture(params=["local", "ssh-systemd", "ssh-plain"])
def host(request, tmp_path):
    if request.param == "local":
        workdir = tmp_path

        def make() -> LocalHost:
            return LocalHost("local", tmp_path / "spool")
    else:
        root: Path = request.getfixturevalue("testhosts_root")
        hosts = request.getfixturevalue("systemd_hosts" if request.param == "ssh-systemd" else "plain_hosts")
        workdir = root / "contract" / f"{request.param}-{next(_runs)}"
        workdir.mkdir(parents=True)
        target = ssh_target(hosts[0], root)

        def make() -> SshHost:
            return SshHost(target.name, target, str(workdir / "spool"), log_path=workdir / "agent.log")
    rig = HostRig(make, workdir)
    try:
        yield rig
    finally:
        try:
            rig.close()
        finally:
            if request.param == "local":  # the journal's pids are this machine's only for a local spool
                kill_leftovers(workdir / "spool")


class TestHostContract(HostContract):
    pass
