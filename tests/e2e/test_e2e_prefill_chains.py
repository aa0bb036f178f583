"""Chains of queued successors end to end (issue 18, `controller: prefill_depth: 2`): a real
controller, its local agent and real jobs on a one-slot host. A job queued behind a queued one
starts only after it; a kill of the chain's middle, a host lost and back, controller restarts
(kill -9) with a chain in place: each job runs once, none beside another (each job appends its
attempt to a file: counted).
"""

from __future__ import annotations

import os

from tests.support.cluster import Cluster, HostOutage, hosts_of, running_cluster
from tests.support.prefill import held, pending, queued, quick, runs
from tests.support.waiting import wait_until

CHAIN = """\
cluster: tc{pid}
hosts:
  - {{name: a, slots: 1, mem: 1G}}
queues:
  - {{name: normal, default: true}}
controller:
  tick: 1s
  grace: 1s
  prefill_depth: 2
"""
TWO_QUEUES = CHAIN.replace("  - {{name: normal, default: true}}\n",
                           "  - {{name: normal, priority: 30, default: true}}\n  - {{name: high, priority: 50}}\n")
SHORT_LEASE = "  lease: 3s\n  lease_margin: 1s\n  host_lost_after: 5s\n"  # a host lost within seconds


def two_deep(c: Cluster, first: str, second: str, third: str) -> tuple[int, int, int]:
    """`first` running (held), `second` (held) queued behind it, `third` (quick) behind `second`."""
    a = held(c, first)
    c.wait_state(a, {"RUN"})
    b = held(c, second)
    queued(c, b, "a", a)
    t = quick(c, third)
    queued(c, t, "a", b)  # behind a queued job: a chain two deep
    return a, b, t


def test_a_chain_two_deep_through_a_kill_of_its_middle_then_a_host_lost_and_back_runs_each_job_once():
    with running_cluster(config=CHAIN.format(pid=os.getpid()) + SHORT_LEASE) as c:
        p, m, t = two_deep(c, "p", "m", "t")
        c.ok("kill", str(m))  # its middle: t now waits behind p, never beside it
        assert c.wait_state(m, {"EXIT"})["start_time"] is None
        queued(c, t, "a", p)
        x = quick(c, "x")
        queued(c, x, "a", t)  # p has its successor still: x goes behind t, not beside it
        assert runs(c, "t") == [] and runs(c, "x") == []
        with HostOutage(c, "a"):  # p runs on; t and x wait in the journal; then the lease runs out
            wait_until(lambda: hosts_of(c)["a"].get("lost") is True, 90, "host a to be declared lost")
            wait_until(lambda: pending(c, p) and pending(c, t) and pending(c, x), 30, "p, t and x requeued")
        wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
        c.wait_state(p, {"RUN"}, timeout=60)
        (c.work / "go-p").touch()
        c.wait_state(t, {"DONE"}, timeout=60), c.wait_state(x, {"DONE"}, timeout=60), c.wait_state(p, {"DONE"})
        jobs = {j: c.job(j) for j in (p, t, x)}
        assert jobs[t]["start_time"] >= jobs[p]["end_time"] and jobs[x]["start_time"] >= jobs[t]["end_time"]
        assert (runs(c, "p"), runs(c, "m"), runs(c, "t"), runs(c, "x")) == (["1", "2"], [], ["2"], ["2"])


def test_a_chain_two_deep_through_controller_restarts_runs_each_job_once_in_order():
    with running_cluster(config=CHAIN.format(pid=os.getpid())) as c:
        p, m, t = two_deep(c, "p", "m", "t")
        c.kill9_controller()  # a restart in the middle: the chain is recovered as it was
        c.start()
        queued(c, m, "a", p), queued(c, t, "a", m)
        c.kill9_controller()  # and p ends with no controller: m starts, t stays behind it
        (c.work / "go-p").touch()
        wait_until(lambda: runs(c, "m") == ["1"], 30, "m to start with no controller")
        c.start()
        c.wait_state(m, {"RUN"})
        queued(c, t, "a", m)
        assert runs(c, "t") == []
        (c.work / "go-m").touch()
        c.wait_state(t, {"DONE"})
        jobs = {j: c.job(j) for j in (p, m, t)}
        assert jobs[m]["start_time"] >= jobs[p]["end_time"] and jobs[t]["start_time"] >= jobs[m]["end_time"]
        assert (runs(c, "p"), runs(c, "m"), runs(c, "t")) == (["1"], ["1"], ["1"])


def test_a_job_of_higher_rank_goes_ahead_of_a_chain_tail_first_and_each_runs_once_in_order():
    with running_cluster(config=TWO_QUEUES.format(pid=os.getpid())) as c:
        a, b, t = two_deep(c, "a", "b", "t")
        hi = quick(c, "hi", "-q", "high")  # later, of a queue of higher priority: it goes next after a
        queued(c, hi, "a", a)
        (c.work / "go-a").touch()
        c.wait_state(hi, {"DONE"})
        (c.work / "go-b").touch()
        c.wait_state(t, {"DONE"}), c.wait_state(b, {"DONE"})
        jobs = {j: c.job(j) for j in (a, hi, b, t)}
        assert jobs[hi]["start_time"] >= jobs[a]["end_time"] and jobs[b]["start_time"] >= jobs[hi]["end_time"]
        assert jobs[t]["start_time"] >= jobs[b]["end_time"]  # a dispatch's order, one job at a time
        assert (runs(c, "a"), runs(c, "hi"), runs(c, "b"), runs(c, "t")) == (["1"], ["1"], ["2"], ["2"])
        assert "withdrawn from host a's queue" in c.ok("hist", str(b))
