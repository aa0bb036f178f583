"""Fixtures of the agent tests: `agents()` starts a RawAgent on the test's spool (each closed at
the end), `agent` is one of them. A module that needs agents on test hosts defines its own `agent`."""

from __future__ import annotations

import pytest

from tests.support.raw_agent import RawAgent


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
