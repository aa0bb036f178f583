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


# Under pytest-xdist (pyproject's addopts, `--dist loadgroup`) the tests of each group here run on one
# worker, in order, never beside each other:
# - cluster-names: `xce init` picks the first free name (xce, xce2...) from a registry each test keeps
#   of its own, so two of these at once pick the same one, and their lab hosts' agent directories
#   (~/.xce-agent/NAME-HOST, the machine's root home) are one: one test's `lab down` or check meets the
#   other's directory.
# - test_web: one dashboard for the module (its `site`); its metrics test expects the host `ghost`
#   lost, as it is once the module's earlier tests have run for host_lost_after (8 s).
GROUPS = {
    "tests/e2e/test_lab.py": "cluster-names",
    "tests/e2e/test_first_contact.py": "cluster-names",
    "tests/e2e/test_shared_lab.py": "cluster-names",
    "tests/e2e/test_readme_e2e.py": "cluster-names",
    "tests/project/test_readme.py": "cluster-names",
    "tests/e2e/test_web.py": "test_web",
}
_ROOT = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = GROUPS.get(item.path.relative_to(_ROOT).as_posix()) if item.path.is_relative_to(_ROOT) else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


pytest_plugins = ["tests.support.testhosts_fixture", "tests.support.fixtures"]
