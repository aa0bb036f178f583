"""Fixtures of the agent tests: `agents()` starts a RawAgent on the test's spool (each closed at
the end), `agent` is one of them. A module that needs agents on test hosts defines its own `agent`.
`hosts(**kw)` connects a LocalHost on the test's spool and gives it with its event queue; at the
end each is closed and whatever still runs from the spool is killed (reused supervisors too).
`workdir` is a fresh directory under the test hosts' root, for the tests that reach test hosts."""

from __future__ import annotations

import itertools
import queue
from pathlib import Path

import pytest

from tests.support.agent_local import kill_leftovers
from tests.support.raw_agent import RawAgent
from xce_lite.exec.local import LocalHost

_runs = itertools.count()


@pytest.fixture
def workdir(testhosts_root, request) -> Path:
    """A fresh directory that this process and the test hosts' jobs both see."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    path = testhosts_root / module / f"{request.node.name[:60]}-{next(_runs)}"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def agents(spool):
    started: list[RawAgent] = []

    def start(*extra: str, **kw) -> RawAgent:
        started.append(RawAgent(spool, *extra, **kw))
        return started[-1]

    yield start
    for agent in started:
        agent.close()


@pytest.fixture
def agent(agents):
    return agents()


@pytest.fixture
def hosts(spool):
    made: list[LocalHost] = []

    def make(**kw) -> tuple[LocalHost, queue.Queue]:
        host, events = LocalHost("local", spool, **kw), queue.Queue()
        made.append(host)
        host.connect(events)
        return host, events

    yield make
    for host in made:
        host.close()
    kill_leftovers(spool)
