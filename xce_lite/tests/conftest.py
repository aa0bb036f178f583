"""Shared fixtures. `cluster` is a running one-host cluster; `idle_cluster` has no controller yet."""

from __future__ import annotations

import pytest

from xce_lite.tests.cluster import Cluster


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


pytest_plugins = ["xce_lite.tests.testhosts_fixture"]
