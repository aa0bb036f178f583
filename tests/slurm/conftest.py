"""Fixtures of the Slurm tests: `slurm`, a real one-node Slurm cluster on loopback (tests/support/slurm.py),
one per test module, stopped by PID at the module's end. Where Slurm cannot run here the test fails
with the remedy: a green run proves Slurm ran."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.slurm import SlurmCluster, missing_prerequisites, pool_config


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    problems = missing_prerequisites()
    if problems:
        pytest.fail("a test Slurm cannot run here: " + "; ".join(problems), pytrace=False)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pool_cluster(slurm: SlurmCluster) -> Iterator:
    """`pool_cluster(**pool_config options)`: a started cluster with the pool hpc on the test Slurm.
    `env`: more of the controller's environment (a PATH with wrappers first)."""
    made: list[Cluster] = []

    def make(env: dict[str, str] | None = None, **options) -> Cluster:
        c = Cluster(config=pool_config(**options))
        made.append(c)
        c.env["SLURM_CONF"] = str(slurm.conf)
        c.env.update(env or {})
        c.start()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()
        slurm.cancel_all()
