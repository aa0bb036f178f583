"""Fixtures of the Slurm tests: `slurm`, a real one-node Slurm cluster on loopback (tests/support/slurm.py),
one per test module, stopped by PID at the module's end. Where Slurm cannot run here the test fails
with the remedy: a green run proves Slurm ran."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.slurm import SlurmCluster, missing_prerequisites


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
