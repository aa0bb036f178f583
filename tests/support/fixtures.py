"""Fixtures that several test modules share, registered for the whole suite by tests/conftest.py
(a module that defines a fixture of the same name uses its own): a store on a fresh SQLite file, a
local agent's spool that is cleaned of leftover jobs, the two kinds of test host, and a running
cluster of two local hosts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_local import kill_leftovers
from tests.support.cluster import Cluster
from tests.support.trust import two_local_hosts
from xce_lite.store.jobs import JobStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    """A JobStore on `tmp_path/xce.db` (the file the `path` fixture of the store tests names)."""
    s = JobStore(tmp_path / "xce.db")
    yield s
    s.close()


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Path]:
    """A spool for a local agent; what a failed test left running from it is killed afterwards."""
    path = tmp_path / "spool"
    yield path
    kill_leftovers(path)


@pytest.fixture(params=["systemd", "plain"])
def kind(request) -> str:
    """Each test that asks runs twice: on a systemd test host and on a plain one."""
    return request.param


@pytest.fixture
def two_hosts(request) -> Iterator[Cluster]:
    """Hosts a and b with a lease of 20 s (a store that holds a tick for its 10 s busy timeout must
    not make the hosts stop their jobs); a host out of reach is lost after the param (default 25s)."""
    with two_local_hosts(getattr(request, "param", "25s")) as c:
        yield c
