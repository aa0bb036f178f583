"""pool_ends.PoolEnds: an end by a signal nobody of ours sent, on a running allocation's host, waits for
an squeue asked after it; counted where the allocation still runs, dropped where it ended (the pool's
end requeued the job), counted as it is when Slurm stays silent past HOLD_MAX."""

from __future__ import annotations

from types import SimpleNamespace

from xce_lite.controller.pool_ends import HOLD_MAX, PoolEnds
from xce_lite.exec.host import JobResult

KILLED = JobResult(None, 15, 1.0, 2.0, 0.0, 0, reason="killed by signal SIGTERM")  # by none of ours
OK = JobResult(0, None, 1.0, 2.0, 0.0, 0)


class Pool:
    """The pools' side: which hosts belong to a running allocation, what was counted, polls asked."""

    def __init__(self) -> None:
        self.running = {"hpc-7": "hpc"}
        self.counted: list[tuple[str, str, JobResult]] = []
        self.polls: list[str] = []
        self.ends = PoolEnds(self.running.get, self.count, self.polls.append)

    def count(self, host: str, unit: str, result: JobResult, now: float) -> None:
        # the units' part calls hold again for the same end: it must not be held twice
        assert not self.ends.hold(host, unit, SimpleNamespace(killed=None), result, now)
        self.counted.append((host, unit, result))


def job(killed: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(killed=killed)


def test_only_an_unexplained_signal_on_a_running_allocations_host_is_held() -> None:
    p = Pool()
    assert not p.ends.hold("hpc-7", "u1", job(), OK, 10.0)  # an exit code: counts at once
    assert not p.ends.hold("hpc-7", "u2", job("killed by user"), KILLED, 10.0)  # our kill
    reasoned = JobResult(None, 9, 1.0, 2.0, 0.0, 0, reason="run limit 00:01:00 reached")
    assert not p.ends.hold("hpc-7", "u3", job(), reasoned, 10.0)  # the supervisor's own
    assert not p.ends.hold("node1", "u4", job(), KILLED, 10.0)  # not a pool's host
    assert p.ends.hold("hpc-7", "u6", job(), JobResult(None, 9, 1.0, 2.0, 0.0, 0), 10.0)  # no reason at all
    assert p.ends.hold("hpc-7", "u5", job(), KILLED, 10.0)
    assert p.polls == ["hpc", "hpc"] and set(p.ends.held) == {"u5", "u6"}
    assert p.ends.hold("hpc-7", "u5", job(), KILLED, 10.5)  # again (adoption): still held, one poll
    assert p.polls == ["hpc", "hpc"] and p.counted == []


def test_an_squeue_asked_before_the_end_settles_nothing_one_after_counts_it_where_the_allocation_runs() -> None:
    p = Pool()
    p.ends.hold("hpc-7", "u1", job(), KILLED, 10.0)
    p.ends.answered("hpc", 9.9, 10.1)  # asked before the end arrived: Slurm may not have known
    assert p.counted == [] and "u1" in p.ends.held
    p.ends.answered("other", 10.2, 10.3)
    assert p.counted == []
    p.ends.answered("hpc", 10.2, 10.4)  # still running: someone else's signal, the end counts
    assert p.counted == [("hpc-7", "u1", KILLED)] and p.ends.held == {}


def test_an_end_whose_allocation_ended_is_dropped_the_pools_end_requeued_its_job() -> None:
    p = Pool()
    p.ends.hold("hpc-7", "u1", job(), KILLED, 10.0)
    del p.running["hpc-7"]  # the squeue said CANCELLED: _pool_end took the host and requeued the job
    p.ends.answered("hpc", 10.5, 10.6)
    assert p.counted == [] and p.ends.held == {}


def test_while_slurm_is_silent_an_end_counts_as_it_is_after_hold_max() -> None:
    p = Pool()
    p.ends.hold("hpc-7", "u1", job(), KILLED, 10.0)
    p.ends.expire(10.0 + HOLD_MAX - 1)
    assert p.counted == []
    p.ends.expire(10.0 + HOLD_MAX + 1)
    assert p.counted == [("hpc-7", "u1", KILLED)] and p.ends.held == {}
