"""The tick's pipeline (issue 18): the scheduling session runs while what the tick learned is written,
in the tick's one transaction, whose dispatches then join it; an API thread holding the state's lock
while it waits for the store's lock cannot deadlock it (the tick rolls back and writes after); on a
host's channel a freed slot's launch goes before the forgets of the units that ended."""

from __future__ import annotations

import threading

from tests.support.inproc import InProc
from tests.support.waiting import wait_until
from xce_lite.controller import core
from xce_lite.controller.invariants import check_invariants


class _Watched:
    """The controller's scheduler seam, the real one behind it, noting at each answer taken whether
    the store's writer connection is inside a transaction and what state it sees `watch` in."""

    def __init__(self, p: InProc, watch: list[int]) -> None:
        self.p, self.real, self.watch = p, p.ctl._scheduler, watch
        self.seen: list[tuple[bool, tuple[str, ...]]] = []
        self.on_receive = None

    def send(self, *args, **kw):
        return self.real.send(*args, **kw)

    def receive(self):
        con = self.p.ctl.store._con
        states = tuple(con.execute("SELECT state FROM jobs WHERE id = ?", (i,)).get for i in self.watch)
        self.seen.append((con.in_transaction, states))
        if self.on_receive is not None:
            self.on_receive()
        return self.real.receive()

    def close(self) -> None:
        self.real.close()


def _first_running(p: InProc, first: int, second: int) -> None:
    p.step(0.1)
    for _ in range(3):
        p.step(0.5)
        if p.job(first).state == "RUN":
            break
    assert (p.job(first).state, p.job(second).state) == ("RUN", "PEND")


def test_the_session_runs_inside_the_ticks_transaction_after_what_it_learned_is_written():
    p = InProc(hosts=("h1",), slots=1)
    try:
        first, second = p.submit(runtime=2), p.submit(runtime=2)
        _first_running(p, first, second)
        watched = p.ctl._scheduler = _Watched(p, [first, second])
        transactions = []
        real_write = p.ctl.store._write
        p.ctl.store._write = lambda: transactions.append(1) or real_write()
        for _ in range(8):  # the first ends: the tick that stores it dispatches the second
            transactions.clear()
            p.step(0.5)
            check_invariants(p.ctl)
            if p.job(second).state != "PEND":
                break
        assert p.job(first).state == "DONE" and p.job(second).state in ("DISP", "RUN")
        assert len(transactions) == 1  # the end and the dispatch it freed: one commit
        # the answer that dispatched the second was taken with the first's end written, not yet committed
        assert watched.seen[-1] == (True, ("DONE", "PEND"))
        events = [kind for _t, kind, _d in p.ctl.store.events(second)]
        assert events[-1] == "dispatched"
    finally:
        p.close()


def test_a_hold_that_writes_under_the_state_lock_during_the_ticks_commit_cannot_deadlock_it():
    p = InProc(hosts=("h1",), slots=1)
    try:
        first, second = p.submit(runtime=2), p.submit(runtime=2)
        _first_running(p, first, second)
        watched = p.ctl._scheduler = _Watched(p, [first, second])
        holding, held = threading.Event(), threading.Event()
        real_change = p.ctl.store.change_state

        def change_state(*args, **kw):  # the hold's store write, with the state's lock held
            holding.set()
            return real_change(*args, **kw)

        p.ctl.store.change_state = change_state

        def hold() -> None:
            p.hold(second)
            held.set()

        def contend() -> None:  # inside the tick's transaction, the second's dispatch decided
            watched.on_receive = None
            threading.Thread(target=hold, daemon=True).start()
            wait_until(holding.is_set, 10, "the hold holds the state's lock, waiting for the store's")

        watched.on_receive = contend
        contended = []
        real_decide = p.ctl._decide

        def decide(*args):
            try:
                return real_decide(*args)
            except core._Contended:
                contended.append(args)
                raise

        p.ctl._decide = decide
        ticked = threading.Event()

        def tick() -> None:
            for _ in range(8):
                p.step(0.5)
                if p.job(first).state == "DONE":
                    break
            ticked.set()

        threading.Thread(target=tick, daemon=True).start()
        wait_until(ticked.is_set, 30, "the ticks ended (no deadlock)")
        wait_until(held.is_set, 10, "the hold was stored")
        assert watched.seen and watched.seen[-1][0]  # the contention came inside the transaction
        assert len(contended) == 1  # which the tick rolled back, then wrote after
        for _ in range(3):
            p.step(0.5)
            check_invariants(p.ctl)
        assert (p.job(first).state, p.job(second).state) == ("DONE", "PSUSP")
        kinds = [kind for _t, kind, _d in p.ctl.store.events(second)]
        assert "held" in kinds and "dispatched" not in kinds
        assert [kind for _t, kind, _d in p.ctl.store.events(first)].count("finished") == 1
    finally:
        p.close()


def test_a_freed_slots_launch_goes_before_the_forget_of_the_unit_that_ended():
    p = InProc(hosts=("h1",), slots=1)
    try:
        first, second = p.submit(runtime=2), p.submit(runtime=2)
        _first_running(p, first, second)
        host = p.ctl.state.hosts["h1"]
        order: list[str] = []
        real_launch, real_forget = host.launch_nowait, host.forget
        host.launch_nowait = lambda requests: order.append("launch") or real_launch(requests)
        host.forget = lambda units, wait=True: order.append("forget") or real_forget(units, wait)
        for _ in range(8):
            order.clear()
            p.step(0.5)
            if p.job(second).state != "PEND":
                break
        assert p.job(first).state == "DONE"
        assert order == ["launch", "forget"]
    finally:
        p.close()


def _counting_transactions(p: InProc) -> list[int]:
    transactions: list[int] = []
    real_write = p.ctl.store._write
    p.ctl.store._write = lambda: transactions.append(1) or real_write()
    return transactions


def test_a_start_alone_waits_for_its_short_jobs_end_and_both_share_one_commit():
    p = InProc(hosts=("h1",), slots=1)
    try:
        p.step(0.1)
        job = p.submit(runtime=0.02)
        transactions = _counting_transactions(p)
        states = []
        for _ in range(12):
            p.step(0.01)
            check_invariants(p.ctl)
            states.append(p.job(job).state)
            if states[-1] == "DONE":
                break
        assert states[-1] == "DONE" and "RUN" not in states  # never stored RUN alone
        kinds = [kind for _t, kind, _d in p.ctl.store.events(job)]
        assert kinds == ["submitted", "dispatched", "started", "finished"]
        assert len(transactions) == 2  # the dispatch; then the start with the end (three before)
    finally:
        p.close()


def test_a_long_jobs_start_is_stored_within_the_wait_and_faults_in_sequence_lose_nothing():
    p = InProc(hosts=("h1", "h2"), slots=1)
    try:
        p.step(0.1)
        long_job, other = p.submit(runtime=30), p.submit(runtime=30)
        seen = []
        for _ in range(12):
            p.step(0.01)
            check_invariants(p.ctl)
            seen.append((p.job(long_job).state, p.ctl.state.active[long_job].state
                         if long_job in p.ctl.state.active else None))
            if seen[-1][0] == "RUN":
                break
        assert seen[-1][0] == "RUN"
        # stored RUN no later than START_WAIT after memory had it RUN (steps of 0.01 s)
        first_run = next(i for i, (_stored, live) in enumerate(seen) if live == "RUN")
        assert len(seen) - 1 - first_run <= round(core.START_WAIT / 0.01) + 1
        # faults in sequence: the first host lost, a restart with the other's start maybe waiting, back
        p.drop("h1")
        p.step(0.01)
        p.restart()
        for _ in range(3):
            p.step(0.01)
            check_invariants(p.ctl)
        p.back("h1")
        for _ in range(100):
            p.step(1.0)
            check_invariants(p.ctl)
            if {p.job(long_job).state, p.job(other).state} == {"DONE"}:
                break
        assert (p.job(long_job).state, p.job(other).state) == ("DONE", "DONE")
        for job in (long_job, other):
            kinds = [kind for _t, kind, _d in p.ctl.store.events(job)]
            assert kinds.count("finished") == 1 and kinds.count("started") >= 1
    finally:
        p.close()
