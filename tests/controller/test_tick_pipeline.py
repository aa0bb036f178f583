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
