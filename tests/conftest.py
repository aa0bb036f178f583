"""Shared fixtures. `cluster` is a running one-host cluster; `idle_cluster` has no controller yet;
the test hosts' and the others shared by several modules come from tests/support/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.cluster import Cluster

# Subprocesses (`python -m xce_lite`, the controller, its agents) import the tree under test, not
# whatever copy `pip install` put in site-packages: a checkout or worktree tests its own code.
_SOURCE_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_SOURCE_ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _SOURCE_ROOT]])


@pytest.fixture
def idle_cluster():
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def cluster(idle_cluster: Cluster):
    idle_cluster.start()
    return idle_cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the controller logs of its clusters (CI keeps only the output)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for c in Cluster.live:
            report.sections.append((f"controller and agents of {c.home} (their last lines)", c.report()))
        for home, text in Cluster.failed:  # closed by the failing block itself (running_cluster)
            report.sections.append((f"controller and agents of {home} (their last lines)", text))
    if report.when == "call":
        Cluster.failed.clear()


pytest_plugins = ["tests.support.testhosts_fixture", "tests.support.fixtures"]
