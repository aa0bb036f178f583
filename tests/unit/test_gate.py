"""gate.py, pure: which waiting jobs the scheduler gets, which are taken back or cancelled, and the
throttle of an array, against facts given by hand (the controller reads them from the store)."""

from __future__ import annotations

from xce_lite.workflow import deps
from xce_lite.workflow.deps import Target
from xce_lite.workflow.deps_eval import group_facts
from xce_lite.workflow.gate import Gate, Waiter


def expr(text: str, arrays: frozenset[int] = frozenset()) -> deps.Expr:
    return deps.resolve(deps.parse(text), lambda ref: [Target(ref.id or 0, ref.id in arrays, ref.text())])


def facts_of(states: dict[int, list[str]]):
    rows = {job: group_facts([(s, 1 if s == "EXIT" else None, s in ("RUN", "DONE", "EXIT")) for s in ss])
            for job, ss in states.items()}
    return lambda target: rows.get(target.id)


def test_a_dependant_is_fed_when_its_condition_holds_and_taken_back_when_it_stops():
    gate = Gate()
    gate.add(Waiter(10, expr("done(1)")))
    gate.add(Waiter(11, expr("!done(2)")))
    first = gate.decide(facts_of({1: ["RUN"], 2: ["RUN"]}), {})
    assert first.feed == (11,) and first.unfeed == () and first.cancel == ()
    assert first.reasons == {10: "waiting for its dependency: done(1): (job 1) is RUN"}
    second = gate.decide(facts_of({1: ["DONE"], 2: ["DONE"]}), {})
    assert second.feed == (10,) and second.unfeed == (11,)
    assert second.cancel == ((11, "dependency can never be satisfied: !done(2): (job 2) is DONE (can never hold)"),)
    assert gate.fed == {10}
    assert gate.targets() == {Target(1, False, "1"), Target(2, False, "2")}


def test_a_condition_that_can_never_hold_cancels_or_pends_as_the_job_asked():
    gate = Gate()
    gate.add(Waiter(10, expr("done(1)")))
    gate.add(Waiter(11, expr("done(1)"), on_dep_fail="pend"))
    decision = gate.decide(facts_of({1: ["EXIT"]}), {})
    assert decision.cancel == ((10, "dependency can never be satisfied: done(1): (job 1) is EXIT (exit code 1) "
                                    "(can never hold)"),)
    assert decision.reasons[11].startswith("its dependency can never be satisfied: done(1)")
    assert "until you kill it" in decision.reasons[11] and decision.feed == ()


def test_a_throttle_feeds_elements_in_index_order_up_to_its_limit():
    gate = Gate()
    for element in range(20, 26):
        gate.add(Waiter(element, array_id=20, throttle=2))
    first = gate.decide(facts_of({}), {})
    assert first.feed == (20, 21)
    assert first.reasons[22] == "array 20 runs at most 2 elements at once (%2); it waits for one to end"
    # 20 and 21 dispatched (they leave the gate and count as active): no room
    gate.remove(20)
    gate.remove(21)
    assert gate.decide(facts_of({}), {20: 2}).feed == ()
    # one of them ended: one more goes
    assert gate.decide(facts_of({}), {20: 1}).feed == (22,)
    # fed but not dispatched yet counts too
    assert gate.decide(facts_of({}), {20: 1}).feed == ()


def test_a_throttled_array_with_a_dependency_waits_for_both():
    gate = Gate()
    shared = expr("done(1)")
    for element in (30, 31, 32):
        gate.add(Waiter(element, shared, array_id=30, throttle=1))
    waiting = gate.decide(facts_of({1: ["RUN"]}), {})
    assert waiting.feed == () and set(waiting.reasons) == {30, 31, 32}
    assert gate.decide(facts_of({1: ["DONE"]}), {}).feed == (30,)


def test_an_array_dependency_counts_its_elements():
    gate = Gate()
    gate.add(Waiter(50, expr("numdone(40, >= 2) && numexit(40, == 0)", frozenset({40}))))
    assert gate.decide(facts_of({40: ["DONE", "RUN", "RUN"]}), {}).feed == ()
    assert gate.decide(facts_of({40: ["DONE", "DONE", "RUN"]}), {}).feed == (50,)
    later = gate.decide(facts_of({40: ["DONE", "DONE", "EXIT"]}), {})
    assert later.unfeed == (50,) and later.cancel[0][0] == 50
