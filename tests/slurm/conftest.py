"""Fixtures of the Slurm tests: `slurm`, a real one-node Slurm cluster on loopback (tests/support/slurm.py),
one per test module, stopped by PID at the module's end. Where Slurm cannot run here the test fails
with the remedy: a green run proves Slurm ran.

Under pytest-xdist (pyproject's addopts: `--dist loadgroup`) each module's tests form one group, run
by one worker: its Slurm starts once, not once per worker that draws one of its tests; the modules
still spread across the workers, each with a Slurm of its own (their own ports and directories)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.slurm import SlurmCluster, missing_prerequisites, pool_config

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(pytest.mark.xdist_group(f"slurm-{item.path.stem}"))


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
