"""Fixtures of the agent tests: `agents()` starts a RawAgent on the test's spool (each closed at
the end), `agent` is one of them. A module that needs agents on test hosts defines its own `agent`.
`hosts(**kw)` connects a LocalHost on the test's spool and gives it with its event queue; at the
end each is closed and whatever still runs from the spool is killed (reused supervisors too)."""

from __future__ import annotations

import queue

import pytest

from tests.support.agent_local import kill_leftovers
from tests.support.raw_agent import RawAgent
from xce_lite.exec.local import LocalHost


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
