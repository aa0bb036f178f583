"""The tick's act (issue 18): a host that gets a freed slot's launch and the forget of the unit that
ended has both inside one Host.corked block (one write, one wake-up of its agent: the channel's side
is tests/exec/test_channel_cork.py), the launch first; a host that gets one line is not corked; and
through faults in sequence (the host lost, back, a controller restart) every job still runs once."""

from __future__ import annotations

import contextlib

from tests.support.inproc import InProc
from xce_lite.controller.invariants import check_invariants


def _record(host, order: list[str]) -> None:
    real_launch, real_forget, real_corked = host.launch_nowait, host.forget, host.corked

    @contextlib.contextmanager
    def corked():
        order.append("cork")
        with real_corked():
            yield
        order.append("uncork")

    host.launch_nowait = lambda requests: order.append("launch") or real_launch(requests)
    host.forget = lambda units, wait=True: order.append("forget") or real_forget(units, wait)
    host.corked = corked


def _run_until(p: InProc, job: int, order: list[str]) -> list[str]:
    """Tick until `job` runs (or ran); what its host saw, each tick's in order."""
    seen: list[str] = []
    for _ in range(20):
        order.clear()
        p.step(0.5)
        check_invariants(p.ctl)
        seen.extend(order)
        if p.job(job).state in ("RUN", "DONE"):
            return seen
    raise AssertionError(f"job {job} is {p.job(job).state}; its host saw {seen}")


def _one_block(seen: list[str]) -> bool:
    """Every launch that came with a forget is in the same corked block, before it."""
    blocks, inside, current = [], False, []
    for what in seen:
        if what == "cork":
            inside, current = True, []
        elif what == "uncork":
            inside = False
            blocks.append(current)
        elif not inside:
            blocks.append([what])
        else:
            current.append(what)
    return all(block == ["launch", "forget"] or block in (["launch"], ["forget"]) for block in blocks)


def test_a_launch_and_a_forget_to_one_host_go_in_one_corked_block_through_faults_in_sequence():
    p = InProc(hosts=("h1",), slots=1, host_lost_after="20s", lease="5s")
    try:
        p.step(0.1)  # the host connects
        jobs = [p.submit(runtime=1) for _ in range(4)]
        order: list[str] = []
        host = p.ctl.state.hosts["h1"]
        _record(host, order)
        assert _run_until(p, jobs[0], order) == ["launch"]  # nothing to forget yet: no cork
        assert _run_until(p, jobs[1], order) == ["cork", "launch", "forget", "uncork"]
        assert p.job(jobs[0]).state == "DONE"
        # the host is lost for a while and comes back, then the controller restarts
        p.drop("h1")
        for _ in range(4):
            p.step(1.0)
            check_invariants(p.ctl)
        p.back("h1")
        p.step(1.0)
        p.restart()
        p.step(0.1)  # the new controller's host connects
        if p.ctl.state.hosts["h1"] is not host:
            _record(p.ctl.state.hosts["h1"], order)
        seen = _run_until(p, jobs[3], order)
        assert "launch" in seen and _one_block(seen), seen
        for _ in range(10):
            p.step(1.0)
            check_invariants(p.ctl)
        assert [p.job(j).state for j in jobs] == ["DONE"] * 4
    finally:
        p.close()
