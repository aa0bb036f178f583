"""The agent's turn over its queue (exec/agent/successors.py `tend`), in process: a link of a chain,
queued behind a unit that is itself queued, is known to wait by one lookup, so each turn asks
`waits` only of a chain's head (a host of 64 slots at depth 8 holds 512 queued units, and the agent
turns once per job's end); and the head alone starts once its predecessor has ended. The agent's
launches are a fake here (they move a unit from the queue to the running ones, as its `launched`
record does); the queue, the units and `Successors` are the agent's own."""

from __future__ import annotations

import time

from xce_lite.exec.agent.journal import Unit
from xce_lite.exec.agent.shared import AgentState
from xce_lite.exec.agent.successors import Successors


class NoLapse:
    def lease_lapsed(self) -> None:
        return None


class Starts:
    """launch_one as far as tend sees it: the unit leaves the queue and runs."""

    def __init__(self, state: AgentState) -> None:
        self.state, self.started = state, list[str]()

    def launch_one(self, spec: dict, forks: list) -> dict:
        name = spec["unit"]
        del self.state.queued[name]
        self.state.units[name] = Unit(time.time())
        self.started.append(name)
        return {"unit": name, "status": "started", "start_time": time.time(), "error": None}


def chained(state: AgentState, head_after: str, n: int, prefix: str) -> None:
    after = head_after
    for i in range(n):
        name = f"{prefix}{i}"
        state.queued[name] = {"unit": name, "after": after}
        after = name


def test_a_turn_asks_only_each_chains_head_and_starts_a_head_once_its_predecessor_ended(tmp_path):
    state = AgentState(str(tmp_path), "h")
    for run in ("r1", "r2"):
        state.units[run] = Unit(time.time())  # running: no result yet
    chained(state, "r1", 100, "a")
    chained(state, "r2", 100, "b")
    starts = Starts(state)
    queue = Successors(state, None, starts, NoLapse())  # type: ignore[arg-type]  # the seams tend uses
    asked: list[object] = []
    real_waits = queue.waits
    queue.waits = lambda after: asked.append(after) or real_waits(after)  # type: ignore[method-assign]

    queue.tend()
    assert starts.started == [] and len(state.queued) == 200
    assert sorted(asked) == ["r1", "r2"]  # not 200 walks of the chains

    state.units["r1"].result = {"exit_code": 0}  # r1 ended: its follower, and only it, starts
    asked.clear()
    queue.tend()
    assert starts.started == ["a0"] and "a1" in state.queued and "b0" in state.queued
    assert sorted(map(str, asked)) == ["r1", "r2"]
    assert [line for line in state.out if b'"unqueued"' in line and b'"a0"' in line]

    queue.tend()  # a0 runs now: nothing more starts
    assert starts.started == ["a0"]
