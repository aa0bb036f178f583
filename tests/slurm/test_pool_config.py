"""`pools:` in xce.yaml: what a Slurm pool may say, and the sbatch options it gives."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from xce_lite.config.cluster import ClusterConfig

BASE = {"cluster": "c", "hosts": [{"name": "login", "slots": 1, "mem": "1G"}],
        "queues": [{"name": "normal", "default": True}, {"name": "hpc", "hosts": ["hpc"]}]}


def config(**pool) -> ClusterConfig:
    return ClusterConfig.model_validate({**BASE, "pools": [{"name": "hpc", "type": "slurm", **pool}]})


def test_a_pool_gives_sbatch_its_shape_then_the_users_arguments() -> None:
    pool = config(partition="compute", account="lab", nodes_per_allocation=2, time_limit="90s", slots=4,
                  mem="2G", sbatch_args=["--qos=low"]).pools[0]
    assert pool.sbatch_options("xce-c-hpc-1") == [
        "--job-name=xce-c-hpc-1", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--mem=2048M",
        "--time=2", "--partition=compute", "--account=lab", "--qos=low"]
    assert (pool.max_allocations, pool.idle_timeout, pool.connect, pool.via) == (1, 300.0, "srun", "local")


@pytest.mark.parametrize("pool, words", [
    ({"type": "pbs"}, "type"),
    ({"via": "login.example.org", "connect": "direct"}, "via: login.example.org is not an ssh host of `hosts:`"),
    ({"via": "login", "connect": "direct"}, "via: login is not an ssh host"),  # a local host
    ({"connect": "ssh"}, "connect"),
    ({"max_allocations": 0}, "max_allocations"),
    ({"attrs": {"type": "x"}}, "attrs.type is set by xce"),
    ({"walltime": "1h"}, "walltime"),
])
def test_what_a_pool_may_not_say(pool, words) -> None:
    with pytest.raises(ValidationError, match=words):
        config(**pool)


def test_a_pool_and_a_host_may_not_share_a_name_and_queues_may_name_only_known_ones() -> None:
    with pytest.raises(ValidationError, match="names both a host and a pool"):
        ClusterConfig.model_validate({**BASE, "pools": [{"name": "login", "type": "slurm"}]})
    with pytest.raises(ValidationError, match="unknown host"):
        ClusterConfig.model_validate({**BASE})  # the queue hpc names a pool that is not there


def test_via_names_an_ssh_host_of_hosts() -> None:
    hosts = [*BASE["hosts"], {"name": "gate", "type": "ssh", "address": "10.0.0.5", "slots": 1, "mem": "1G"}]
    got = ClusterConfig.model_validate({**BASE, "hosts": hosts, "pools": [
        {"name": "hpc", "type": "slurm", "via": "gate"}]})
    assert (got.pools[0].via, got.pools[0].connect) == ("gate", "srun")  # the relays run through it too
