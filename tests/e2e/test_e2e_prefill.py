"""Queued successors end to end (issue 18, prefill): a real controller, its local agents and real jobs
(prefill is on by default). A job that fits inside a running job's allocation waits on that host (PEND),
queued behind that job, keeping the pend reason a dispatch gives it, and starts when that job ends;
kills, a controller killed -9 and a host lost and back, in sequence, never run a job twice (each job
appends its attempt to a file: counted). A successor queued behind a long job is withdrawn to room that
frees elsewhere, and the host's answer decides the race with its start; one gives way to a job of higher
rank submitted after it.
"""

from __future__ import annotations

import os
import signal
from contextlib import AbstractContextManager

import pytest

from tests.support.agent_local import journal_result
from tests.support.cluster import Cluster, HostOutage, hosts_of, running_cluster
from tests.support.prefill import agent_pid, held, pending, queued, quick, runs, two_busy_hosts
from tests.support.waiting import wait_until


SHORT_LEASE = """\
cluster: tp{pid}
hosts:
  - {{name: a, slots: 1, mem: 1G, tags: [ha]}}
  - {{name: b, slots: 1, mem: 1G, tags: [hb]}}
queues:
  - {{name: normal, default: true}}
controller:
  tick: 1s
  grace: 1s
  lease: 3s
  lease_margin: 1s
  host_lost_after: 5s
"""


ONE_SLOT = """\
cluster: tq{pid}
hosts:
  - {{name: local, slots: 1, mem: 1G}}
queues:
  - {{name: normal, default: true}}
controller:
  tick: 1s
  grace: 1s
"""


TWO_HOSTS = """\
cluster: tw{pid}
hosts:
  - {{name: a, slots: 1, mem: 1G, tags: [ha]}}
  - {{name: b, slots: 1, mem: 1G, tags: [hb]}}
queues:
  - {{name: normal, default: true}}
controller:
  tick: 1s
  grace: 1s
"""


TWO_QUEUES = """\
cluster: tr{pid}
hosts:
  - {{name: local, slots: 1, mem: 1G}}
queues:
  - {{name: normal, priority: 30, default: true}}
  - {{name: high, priority: 50}}
controller:
  tick: 1s
  grace: 1s
"""


ONE_DEEP = "  prefill_depth: 1\n"  # one successor per running job (chains: test_e2e_prefill_chains.py)


def one_slot(extra: str = "") -> AbstractContextManager[Cluster]:
    return running_cluster(config=ONE_SLOT.format(pid=os.getpid()) + extra)


def test_successors_start_in_order_as_each_predecessor_ends_and_run_once():
    with one_slot(ONE_DEEP) as c:
        a = held(c, "a")
        c.wait_state(a, {"RUN"})
        b, d = held(c, "b"), quick(c, "d")
        row = queued(c, b, "local", a)
        assert "queued on local behind job" in c.ok("jobs", "-l", str(b))
        assert f"queued on local behind job {a}" in c.ok("jobs", "-p")  # it waits: listed with its reason
        stop = c.xce("suspend", str(b))  # nothing runs to stop: refused, saying what to do instead
        assert stop.returncode != 0 and "has not started" in stop.stdout + stop.stderr, stop
        assert f"xce requeue --hold {b}" in stop.stdout + stop.stderr
        assert pending(c, d) and runs(c, "b") == []  # one successor per unit; b waits, unstarted
        (c.work / "go-a").touch()
        c.wait_state(b, {"RUN"})
        queued(c, d, "local", b)  # b runs now: d is its successor
        assert c.job(a)["state"] == "DONE" and c.job(b)["pend_reason"] is None
        (c.work / "go-b").touch()
        c.wait_state(d, {"DONE"})
        starts = {j: c.job(j)["start_time"] for j in (a, b, d)}
        ends = {j: c.job(j)["end_time"] for j in (a, b, d)}
        assert starts[b] >= ends[a] and starts[d] >= ends[b]  # a slot is never used twice at once
        assert (runs(c, "a"), runs(c, "b"), runs(c, "d")) == (["1"], ["1"], ["1"])
        assert row["hosts"] == [["local", 1]]


def test_a_killed_successor_ends_exit_unstarted_and_the_next_one_takes_its_place():
    with one_slot() as c:
        a = held(c, "a")
        c.wait_state(a, {"RUN"})
        b = held(c, "b")
        queued(c, b, "local", a)
        c.ok("kill", str(b))
        gone = c.wait_state(b, {"EXIT"})
        assert gone["reason"].startswith("killed by") and gone["start_time"] is None, gone
        d = quick(c, "d")
        queued(c, d, "local", a)  # the unit has no successor any more: d follows a
        (c.work / "go-a").touch()
        c.wait_state(d, {"DONE"})
        assert runs(c, "b") == [] and runs(c, "d") == ["1"] and c.job(a)["state"] == "DONE"
        # and a killed predecessor lets its successor start
        e = held(c, "e")
        c.wait_state(e, {"RUN"})
        f = quick(c, "f")
        queued(c, f, "local", e)
        c.ok("kill", str(e))
        c.wait_state(f, {"DONE"})
        assert runs(c, "f") == ["1"] and c.job(e)["state"] == "EXIT"


def test_controller_killed_while_successors_wait_each_job_runs_exactly_once():
    with one_slot() as c:
        a = held(c, "a")
        c.wait_state(a, {"RUN"})
        b = held(c, "b")
        queued(c, b, "local", a)
        c.kill9_controller()
        (c.work / "go-a").touch()  # a ends while no controller runs: the agent starts b by itself
        wait_until(lambda: runs(c, "b") == ["1"], 30, "b to start with no controller")
        c.start()
        c.wait_state(b, {"RUN"})
        assert c.job(a)["state"] == "DONE"
        d = quick(c, "d")
        queued(c, d, "local", b)
        c.kill9_controller()  # and again, while d waits and b runs
        c.start()
        queued(c, d, "local", b)  # recovered as it was
        (c.work / "go-b").touch()
        c.wait_state(d, {"DONE"})
        assert (runs(c, "a"), runs(c, "b"), runs(c, "d")) == (["1"], ["1"], ["1"])
        assert c.job(b)["state"] == "DONE"


def test_host_lost_while_a_successor_waits_then_back_runs_nothing_twice():
    with running_cluster(config=SHORT_LEASE.format(pid=os.getpid())) as c:
        a = held(c, "a", "-R", "select[ha]")
        c.wait_state(a, {"RUN"})
        b = quick(c, "b", "-R", "select[ha]")
        queued(c, b, "a", a)
        with HostOutage(c, "a"):  # the agent killed, its spool held: a runs on, b waits in the journal
            wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
            wait_until(lambda: hosts_of(c)["a"].get("lost") is True, 90, "host a to be declared lost")
            wait_until(lambda: pending(c, a) and pending(c, b), 30,
                       "a and b requeued")
        wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
        (c.work / "go-a").touch()
        c.wait_state(b, {"DONE"}, timeout=60)
        c.wait_state(a, {"DONE"}, timeout=60)
        assert runs(c, "b") == ["2"]  # the first attempt never started: its queue was dropped
        assert runs(c, "a") == ["1", "2"]  # the lease stopped the first copy; the requeued one ran


def test_a_queued_successor_is_withdrawn_to_room_that_frees_elsewhere_and_runs_once():
    with running_cluster(config=TWO_HOSTS.format(pid=os.getpid())) as c:
        long, other, s = two_busy_hosts(c)
        (c.work / "go-other").touch()  # b frees; a's job runs on for as long as it likes
        done = c.wait_state(s, {"DONE"})
        assert done["hosts"] == [["b", 1]] and c.job(long)["state"] == "RUN"  # long before the long job ends
        assert runs(c, "s") == ["2"]  # attempt 1, withdrawn from a's queue, never started
        assert "withdrawn from host a's queue" in c.ok("hist", str(s))
        (c.work / "go-long").touch()
        c.wait_state(long, {"DONE"})
        assert (runs(c, "long"), runs(c, "other"), runs(c, "s")) == (["1"], ["1"], ["2"])
        assert c.job(other)["state"] == "DONE"


def test_a_successor_recovered_by_a_restarted_controller_is_withdrawn_all_the_same():
    with running_cluster(config=TWO_HOSTS.format(pid=os.getpid())) as c:
        long, _other, s = two_busy_hosts(c)
        c.kill9_controller()
        c.start()
        queued(c, s, "a", long)  # recovered from its stored reason, its request merged again
        (c.work / "go-other").touch()
        done = c.wait_state(s, {"DONE"})
        assert done["hosts"] == [["b", 1]] and c.job(long)["state"] == "RUN" and runs(c, "s") == ["2"]
        (c.work / "go-long").touch()
        c.wait_state(long, {"DONE"})
        assert runs(c, "long") == runs(c, "other") == ["1"]


def test_a_withdrawal_that_finds_the_successor_started_leaves_it_running_where_it_is():
    with running_cluster(config=TWO_HOSTS.format(pid=os.getpid())) as c:
        long, other, s = two_busy_hosts(c)
        pid = agent_pid(c, "a")
        os.kill(pid, signal.SIGSTOP)  # a's agent hears of nothing until the withdrawal waits for it
        try:
            (c.work / "go-long").touch()  # a's job ends: its successor's slot is free, unknown to all
            unit = c.job(long)["unit"]
            wait_until(lambda: journal_result(c.home / "spool" / "a", unit), 30, "the long job's result on a")
            (c.work / "go-other").touch()  # b frees: the controller withdraws s from a's queue
            wait_until(lambda: "withdrawing it from host a's queue" in c.log_tail(), 30, "the withdrawal to be sent")
        finally:
            os.kill(pid, signal.SIGCONT)
        done = c.wait_state(s, {"DONE"})
        assert done["hosts"] == [["a", 1]]  # it started first: it ran where it was queued
        assert runs(c, "s") == ["1"] and c.job(long)["state"] == "DONE" and c.job(other)["state"] == "DONE"


def test_a_successor_whose_predecessor_ended_before_its_launch_came_starts_at_once_and_takes_a_successor():
    """The race behind a test that once timed out: b's launch reaches its host after a ended, so
    the host starts b at once and says so in the launch reply (no `unqueued`); d, waiting, must
    still become b's successor while b runs (prefilling.hidden wakes a session for it)."""
    with one_slot() as c:
        a = held(c, "a")
        c.wait_state(a, {"RUN"})
        pid = agent_pid(c, "local")
        os.kill(pid, signal.SIGSTOP)  # b's launch waits in the channel
        try:
            b, d = held(c, "b"), held(c, "d")
            queued(c, b, "local", a)
            (c.work / "go-a").touch()
            unit = c.job(a)["unit"]
            wait_until(lambda: journal_result(c.home / "spool" / "local", unit), 30, "a's result in the journal")
        finally:
            os.kill(pid, signal.SIGCONT)
        c.wait_state(b, {"RUN"})
        queued(c, d, "local", b)
        (c.work / "go-b").touch(), (c.work / "go-d").touch()
        c.wait_state(d, {"DONE"})
        assert (runs(c, "a"), runs(c, "b"), runs(c, "d")) == (["1"], ["1"], ["1"])


@pytest.mark.parametrize("hold", [("requeue", "--hold"), ("hold",)])
def test_a_queued_successor_held_by_requeue_hold_never_starts_there_and_runs_once_released(hold):
    """`xce requeue --hold` (what a refused suspend suggests) and `xce hold` (it shows PEND: held as
    a pending job is) take it out of its host's queue, held."""
    with one_slot() as c:
        a = held(c, "a")
        c.wait_state(a, {"RUN"})
        b = quick(c, "b")
        queued(c, b, "local", a)
        c.ok(*hold, str(b))
        c.wait_state(b, {"PSUSP"})
        (c.work / "go-a").touch()
        c.wait_state(a, {"DONE"})
        c.ok("hosts")  # one more round trip: b did not start behind a
        assert c.job(b)["state"] == "PSUSP" and runs(c, "b") == []
        c.ok("release", str(b))
        c.wait_state(b, {"DONE"})
        assert runs(c, "b") == ["2"]  # the held attempt never started


def test_an_array_with_a_queued_element_is_held_whole_and_runs_each_element_once_released():
    """`xce hold ARRAY` while one element waits queued behind a running job (shown PEND, with no
    execution host yet): every element is held, the queued one leaves its host's queue and never
    starts there; released, each runs once."""
    with one_slot() as c:
        a = held(c, "a")
        c.wait_state(a, {"RUN"})
        array = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {c.work}/e$XCE_ARRAY_INDEX.runs',
                         options=("-J", "arr[1-3]"))
        first = queued(c, array, "local", a)  # the array's id is its first element's
        assert first["array_index"] == 1 and first["id"] == array
        row = next(line.split() for line in c.ok("jobs", "--elements").splitlines() if line.split()[0] == f"{array}[1]")
        assert row[2] == "PEND" and row[5] == "-"  # STAT, EXEC_HOST
        assert c.ok("hold", str(array)).strip() == f"Array <{array}>: 3 element(s) held"
        for element in range(array, array + 3):
            c.wait_state(element, {"PSUSP"})
        (c.work / "go-a").touch()
        c.wait_state(a, {"DONE"})
        c.ok("hosts")  # one more round trip: the held element did not start behind a
        assert all(c.job(e)["state"] == "PSUSP" for e in range(array, array + 3))
        assert [runs(c, f"e{i}") for i in (1, 2, 3)] == [[], [], []]
        c.ok("release", str(array))
        for element in range(array, array + 3):
            c.wait_state(element, {"DONE"})
        # the queued ones requeued once: one session names a whole chain, here all three (prefill_depth 8 by default)
        assert [runs(c, f"e{i}") for i in (1, 2, 3)] == [["2"], ["2"], ["2"]]


def test_a_queued_successor_gives_way_to_a_job_of_higher_rank_which_runs_first_each_once():
    with running_cluster(config=TWO_QUEUES.format(pid=os.getpid()) + ONE_DEEP) as c:
        a = held(c, "a")
        c.wait_state(a, {"RUN"})
        b = held(c, "b")
        queued(c, b, "local", a)
        hi = quick(c, "hi", "-q", "high")  # later, of a queue of higher priority: it takes b's place
        queued(c, hi, "local", a)
        assert pending(c, b) and runs(c, "b") == []
        assert f"withdrawn from host local's queue: job {hi} ranks before it" in c.ok("hist", str(b))
        c.kill9_controller()  # a restart in the middle: hi is recovered queued, b stays pending
        c.start()
        queued(c, hi, "local", a)
        sp = quick(c, "sp", "-sp", "90")  # of b's queue, with a higher -sp: second after hi, before b
        c.ok("hosts")  # one more round trip: b keeps no place ahead of it
        assert pending(c, b) and pending(c, sp)
        (c.work / "go-a").touch()
        c.wait_state(hi, {"DONE"}), c.wait_state(sp, {"DONE"})
        (c.work / "go-b").touch()
        c.wait_state(b, {"DONE"})
        jobs = {j: c.job(j) for j in (a, hi, sp, b)}
        assert jobs[hi]["start_time"] >= jobs[a]["end_time"]  # the slot is never used twice at once
        assert jobs[sp]["start_time"] >= jobs[hi]["end_time"] and jobs[b]["start_time"] >= jobs[sp]["end_time"]
        assert (runs(c, "a"), runs(c, "hi"), runs(c, "sp"), runs(c, "b")) == (["1"], ["1"], ["1"], ["2"])
        assert c.ok("hist", str(b)).count("withdrawn from host") == 1  # no thrash: it never came back before hi


def test_a_queued_successor_keeps_the_reason_a_dispatch_gives_it_and_says_where_it_waits():
    """What an LSF user reads of a queued successor: the pend reason a dispatch would give it (what
    it waits for), then where it waits; `xce why` tries it on the hosts as they are now, and a
    restarted controller says the same."""
    with one_slot() as c:
        a = held(c, "a")
        c.wait_state(a, {"RUN"})
        b = quick(c, "b")
        assert queued(c, b, "local", a)["pend_reason"] == "local: slots needed 1, free 0"
        where = f"queued on local behind job {a}: starts when it ends"
        long = c.ok("jobs", "-l", str(b))
        assert f"Pending: local: slots needed 1, free 0\n  Pending: {where}\n" in long
        assert f"dispatched: attempt 1 on 1*local, queued on local behind job {a}" in long  # its history
        assert f"PEND  sh\n  local: slots needed 1, free 0\n  {where}\n" in c.ok("jobs", "-p")
        assert f"Job <{b}> PEND: local: slots needed 1, free 0\n  local: slots needed 1, free 0\n  {where}\n" \
            in c.ok("why", str(b))
        c.kill9_controller()
        c.start()
        assert queued(c, b, "local", a)["pend_reason"] == "local: slots needed 1, free 0"
        assert where in c.ok("why", str(b))
        (c.work / "go-a").touch()
        assert c.xce("wait", str(b)).returncode == 0 and runs(c, "b") == ["1"]
        assert c.job(b)["pend_reason"] is None and c.job(b)["queued_behind"] is None

