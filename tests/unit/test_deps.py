"""Dependencies, pure: parsing (with positions), resolution, and every condition's verdict, including
when it can never hold, with table-driven cases and properties over random job histories."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xce_lite.errors import SpecError
from xce_lite.workflow import deps, deps_eval
from xce_lite.workflow.deps import And, Cond, Not, Or, Ref, Target
from xce_lite.workflow.deps_eval import GroupFacts, Verdict, group_facts

# ---- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("done(5)", Cond("done", Ref(id=5))),
    ("ended(prep)", Cond("ended", Ref(name="prep"))),
    ('started("my job")', Cond("started", Ref(name="my job"))),
    ("exit(7)", Cond("exit", Ref(id=7))),
    ("exit(7, 3)", Cond("exit", Ref(id=7), "==", 3)),
    ("exit(7, != 0)", Cond("exit", Ref(id=7), "!=", 0)),
    ("done(sims[7])", Cond("done", Ref(name="sims", index=7))),
    ("done(42[3])", Cond("done", Ref(id=42, index=3))),
    ("numdone(42, >= 10)", Cond("numdone", Ref(id=42), ">=", 10)),
    ("numexit(42, == 0)", Cond("numexit", Ref(id=42), "==", 0)),
    ("numended(sims, == *)", Cond("numended", Ref(name="sims"), "==", None)),
    ("42", Cond("done", Ref(id=42))),
    ("sim*", Cond("done", Ref(name="sim*"))),
    ("done(1) && done(2) || !done(3)",
     Or((And((Cond("done", Ref(id=1)), Cond("done", Ref(id=2)))), Not(Cond("done", Ref(id=3)))))),
    ("done(1) && (done(2) || done(3))",
     And((Cond("done", Ref(id=1)), Or((Cond("done", Ref(id=2)), Cond("done", Ref(id=3))))))),
    ("!!ended(4)", Not(Not(Cond("ended", Ref(id=4))))),
])
def test_parse_reads_every_lsf_form(text, expected):
    assert deps.parse(text) == expected
    assert deps.parse(deps.format_expr(expected)) == expected


@pytest.mark.parametrize("text, expected", [
    ("afterok:4", Cond("done", Ref(id=4))),
    ("afterok:4:5", And((Cond("done", Ref(id=4)), Cond("done", Ref(id=5))))),
    ("afterany:4,afternotok:5", And((Cond("ended", Ref(id=4)), Cond("exit", Ref(id=5))))),
    ("after:4?afterok:5_2", Or((Cond("started", Ref(id=4)), Cond("done", Ref(id=5, index=2))))),
])
def test_slurm_forms_are_sugar_for_the_lsf_conditions(text, expected):
    assert deps.parse(text) == expected


@pytest.mark.parametrize("text, position, words", [
    ("done(5) &&", 11, "expected a condition"),
    ("done(5", 7, "expected ')'"),
    ("exit(5, >)", 10, "expected an exit code"),
    ("done(5) & done(6)", 9, "unexpected '&'"),
    ("numdone(4)", 10, "expected ','"),
    ("numdone(4, 3)", 12, "expected a comparison"),
    ("done(5) done(6)", 9, "expected && or ||"),
    ("(done(5)", 9, "to close the parenthesis"),
    ("done(0)", 6, "job ids start at 1"),
    ("done(sims[0])", 11, "array index"),
    ("done()", 6, "expected a job"),
    ("afterok:x", 1, "not a Slurm dependency"),
    ("finished(3)", 1, "unknown condition 'finished'; the conditions are done, ended"),
    ("done(2) && Done(3)", 12, "unknown condition 'Done'"),
])
def test_malformed_dependencies_name_the_position(text, position, words):
    with pytest.raises(SpecError) as err:
        deps.parse(text)
    message = str(err.value)
    assert f"position {position}:" in message and words in message
    _first, shown, caret = message.splitlines()
    assert shown.strip() == text and caret.index("^") - 2 == position - 1


def test_an_empty_dependency_is_refused_with_an_example():
    with pytest.raises(SpecError, match=r"empty.*done\(42\)"):
        deps.parse("   ")


# ---- resolution ------------------------------------------------------------------------------------


def test_resolve_replaces_refs_and_a_wildcard_means_each_of_its_matches():
    jobs = {"prep": [Target(41, label="prep")], "sim*": [Target(42, True, "sim*"), Target(60, label="sim*")]}

    def lookup(ref: Ref):
        if ref.id is not None:
            return [Target(ref.id, label=ref.text())]
        return jobs.get(ref.name, [])

    resolved = deps.resolve(deps.parse("done(prep) && ended(sim*) || exit(9)"), lookup)
    each_sim = And((Cond("ended", Target(42, True, "sim*")), Cond("ended", Target(60, label="sim*"))))
    assert resolved == Or((And((Cond("done", Target(41, label="prep")), each_sim)), Cond("exit", Target(9, label="9"))))
    assert deps.from_json(deps.to_json(resolved)) == resolved
    assert deps.targets(resolved) == {Target(41, label="prep"), Target(42, True, "sim*"), Target(60, label="sim*"),
                                      Target(9, label="9")}
    assert deps.labelled(resolved) == "(done(prep) && (ended(sim*) && ended(sim*))) || exit(9)"
    with pytest.raises(SpecError, match="done.nothing. names no job|nothing names no job"):
        deps.resolve(deps.parse("done(nothing)"), lookup)


@pytest.mark.parametrize("text", ["numdone(prep, >= 1)", "numexit(41, == 0)", "numended(sim*, == *)",
                                  "done(1) || numdone(sims[3], > 0)"])
def test_counting_the_elements_of_a_job_that_is_not_an_array_is_refused(text):
    jobs = {"prep": [Target(41, label="prep")], "sim*": [Target(42, True, "sim*"), Target(60, label="sim*")],
            "sims": [Target(43, False, "sims[3]")]}

    def lookup(ref: Ref):
        return [Target(ref.id, ref.id == 42, ref.text())] if ref.id is not None else jobs[ref.name]

    with pytest.raises(SpecError, match=r"counts the elements of an array, and .*is not an array; use done\("):
        deps.resolve(deps.parse(text), lookup)
    assert deps.resolve(deps.parse("numdone(42, >= 1)"), lookup) == Cond("numdone", Target(42, True, "42"), ">=", 1)


# ---- evaluation ------------------------------------------------------------------------------------


def job(state: str, code: int | None = None, started: bool | None = None) -> GroupFacts:
    ran = state in ("RUN", "USUSP", "SSUSP", "DONE") or (state == "EXIT" and code is not None) if started is None \
        else started
    return group_facts([(state, code, ran)])


def array(*states: str) -> GroupFacts:
    return group_facts([(s, 1 if s == "EXIT" else None, s not in ("PEND", "PSUSP", "DISP")) for s in states])


NOW, WAIT, NEVER, FOREVER = Verdict(True, False), Verdict(False, False), Verdict(False, True), Verdict(True, True)


@pytest.mark.parametrize("text, facts, verdict", [
    ("done(1)", job("PEND"), WAIT),
    ("done(1)", job("RUN"), WAIT),
    ("done(1)", job("DONE"), FOREVER),
    ("done(1)", job("EXIT", 3), NEVER),
    ("ended(1)", job("RUN"), WAIT),
    ("ended(1)", job("DONE"), FOREVER),
    ("ended(1)", job("EXIT", 3), FOREVER),
    ("exit(1)", job("RUN"), WAIT),
    ("exit(1)", job("EXIT", 3), FOREVER),
    ("exit(1)", job("EXIT", None, started=True), FOREVER),
    ("exit(1)", job("DONE"), NEVER),
    ("exit(1, 3)", job("EXIT", 3), FOREVER),
    ("exit(1, 3)", job("EXIT", 4), NEVER),
    ("exit(1, > 2)", job("EXIT", 4), FOREVER),
    ("exit(1, != 0)", job("EXIT", None, started=True), NEVER),  # killed by a signal: no code to compare
    ("started(1)", job("PEND"), WAIT),
    ("started(1)", job("DISP"), WAIT),
    ("started(1)", job("RUN"), FOREVER),
    ("started(1)", job("USUSP"), FOREVER),
    ("started(1)", job("DONE"), FOREVER),
    ("started(1)", job("EXIT", None, started=False), NEVER),  # killed while it pended
    ("!done(1)", job("RUN"), NOW),
    ("!done(1)", job("DONE"), NEVER),
    ("!done(1)", job("EXIT", 1), FOREVER),
    ("!started(1)", job("PEND"), NOW),
])
def test_each_condition_on_one_job(text, facts, verdict):
    expr = deps.resolve(deps.parse(text), lambda ref: [Target(ref.id or 0)])
    assert deps_eval.evaluate(expr, lambda _t: facts) == verdict


@pytest.mark.parametrize("text, states, verdict", [
    ("done(9)", ("DONE", "DONE", "DONE"), FOREVER),
    ("done(9)", ("DONE", "RUN", "PEND"), WAIT),
    ("done(9)", ("DONE", "EXIT", "RUN"), NEVER),
    ("ended(9)", ("DONE", "EXIT", "RUN"), WAIT),
    ("ended(9)", ("DONE", "EXIT", "EXIT"), FOREVER),
    ("exit(9)", ("EXIT", "EXIT", "RUN"), WAIT),
    ("exit(9)", ("EXIT", "DONE", "RUN"), NEVER),
    ("started(9)", ("RUN", "DONE", "PEND"), WAIT),
    ("started(9)", ("RUN", "DONE", "EXIT"), FOREVER),
    ("numdone(9, >= 2)", ("DONE", "RUN", "PEND"), WAIT),
    ("numdone(9, >= 2)", ("DONE", "DONE", "PEND"), FOREVER),
    ("numdone(9, >= 2)", ("DONE", "EXIT", "EXIT"), NEVER),
    ("numdone(9, == 1)", ("DONE", "RUN", "PEND"), NOW),  # true now, but another DONE would break it
    ("numdone(9, == 1)", ("DONE", "EXIT", "EXIT"), FOREVER),
    ("numdone(9, == 1)", ("DONE", "DONE", "RUN"), NEVER),
    ("numdone(9, < 2)", ("DONE", "RUN", "RUN"), NOW),
    ("numdone(9, < 2)", ("DONE", "DONE", "RUN"), NEVER),
    ("numdone(9, != 3)", ("DONE", "EXIT", "RUN"), FOREVER),
    ("numdone(9, == *)", ("DONE", "DONE", "DONE"), FOREVER),
    ("numdone(9, == *)", ("DONE", "EXIT", "RUN"), NEVER),
    ("numexit(9, == 0)", ("DONE", "RUN", "RUN"), NOW),
    ("numexit(9, == 0)", ("DONE", "DONE", "DONE"), FOREVER),
    ("numexit(9, > 0)", ("EXIT", "RUN", "RUN"), FOREVER),
    ("numended(9, >= 3)", ("DONE", "EXIT", "RUN"), WAIT),
    ("numended(9, >= 3)", ("DONE", "EXIT", "EXIT"), FOREVER),
    ("numended(9, <= 1)", ("DONE", "EXIT", "RUN"), NEVER),
])
def test_each_condition_on_an_array(text, states, verdict):
    expr = deps.resolve(deps.parse(text), lambda ref: [Target(ref.id or 0, array=True)])
    assert deps_eval.evaluate(expr, lambda _t: array(*states)) == verdict


@pytest.mark.parametrize("text, verdict", [
    # 1 DONE, 2 EXIT, 3 RUN
    ("done(1) && done(3)", WAIT),
    ("done(1) && done(2)", NEVER),  # one side can never hold: the whole can never hold
    ("done(2) && done(3)", NEVER),
    ("done(2) || done(3)", WAIT),  # one side may still hold
    ("done(2) || exit(3)", WAIT),
    ("done(1) || done(3)", FOREVER),  # one side holds for good
    ("done(2) || done(2)", NEVER),
    ("!(done(2) || done(3))", NOW),
    ("!(done(1) && ended(2))", NEVER),
    ("(done(2) || ended(3)) && !exit(1)", WAIT),
])
def test_failure_propagates_through_and_or_not(text, verdict):
    facts = {1: job("DONE"), 2: job("EXIT", 1), 3: job("RUN")}
    expr = deps.resolve(deps.parse(text), lambda ref: [Target(ref.id or 0)])
    assert deps_eval.evaluate(expr, lambda t: facts[t.id]) == verdict


def test_a_target_with_no_facts_can_never_hold():
    expr = deps.resolve(deps.parse("done(8)"), lambda ref: [Target(8)])
    assert deps_eval.evaluate(expr, lambda _t: None) == NEVER


def test_unmet_lists_each_condition_by_the_name_given_with_its_state():
    lookup = {"prep": Target(41, label="prep"), "sims": Target(42, True, "sims"), "7": Target(7, label="7")}
    expr = deps.resolve(deps.parse("done(prep) && done(sims) && !ended(7)"),
                        lambda ref: [lookup[ref.text()]])
    facts = {41: job("EXIT", 3), 42: array("DONE", "RUN", "PEND"), 7: job("RUN")}
    assert deps_eval.unmet(expr, lambda t: facts[t.id]) == [
        "done(prep): prep (job 41) is EXIT (exit code 3) (can never hold)",
        "done(sims): sims (array 42) has 1 DONE, 1 PEND, 1 RUN of 3",
    ]
    assert deps_eval.unmet(expr, lambda t: {41: job("DONE"), 42: array("DONE"), 7: job("RUN")}[t.id]) == []


# ---- properties ------------------------------------------------------------------------------------

JOBS = (1, 2, 3)
conditions = st.builds(Cond, st.sampled_from(deps.PLAIN), st.sampled_from([Target(j) for j in JOBS])) | st.builds(
    lambda kind, j, op, n: Cond(kind, Target(j, True), op, n), st.sampled_from(deps.COUNTS), st.sampled_from(JOBS),
    st.sampled_from(deps.OPS), st.one_of(st.none(), st.integers(0, 4)))
expressions = st.recursive(conditions, lambda inner: st.builds(Not, inner)
                           | st.builds(And, st.tuples(inner, inner)) | st.builds(Or, st.tuples(inner, inner)),
                           max_leaves=6)
# One element's life: it may start, then ends DONE or EXIT, or ends EXIT without starting.
LIVES = [("PEND", "RUN", "DONE"), ("PEND", "RUN", "EXIT"), ("PEND", "EXIT"), ("PEND", "DISP", "RUN", "DONE")]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions, st.lists(st.lists(st.sampled_from(range(len(LIVES))), min_size=3, max_size=3), min_size=3,
                             max_size=3), st.randoms(use_true_random=False))
def test_a_final_verdict_never_changes_as_jobs_move_on(expr, lives, rnd):
    """Whatever happens later to the jobs, a verdict said to be final keeps its value."""
    # three groups of three elements; each element walks its life one step at a time, in random order
    paths = {j: [LIVES[k] for k in lives[i]] for i, j in enumerate(JOBS)}
    step = {(j, e): 0 for j in JOBS for e in range(3)}

    def facts(target: Target) -> GroupFacts:
        elements = range(3) if target.array else range(1)
        rows = []
        for e in elements:
            path = paths[target.id][e]
            state = path[step[(target.id, e)]]
            rows.append((state, 1 if state == "EXIT" else None, "RUN" in path[: step[(target.id, e)] + 1]))
        return group_facts(rows)

    final: Verdict | None = None
    for _ in range(40):
        verdict = deps_eval.evaluate(expr, facts)
        if final is not None:
            assert verdict.value == final.value, f"{deps.format_expr(expr)} flipped after it was final"
        elif verdict.final:
            final = verdict
        movable = [key for key, at in step.items() if at < len(paths[key[0]][key[1]]) - 1]
        if not movable:
            break
        step[rnd.choice(movable)] += 1


indices = st.one_of(st.none(), st.integers(1, 9))
names = st.text(st.sampled_from("abz_-.*7é"), min_size=1, max_size=6) | st.text(min_size=1, max_size=5)
parsed_refs = st.builds(lambda i, x: Ref(id=i, index=x), st.integers(1, 99), indices) | st.builds(
    lambda n, x: Ref(name=n, index=x), names, indices)
parsed_conditions = st.builds(Cond, st.sampled_from(deps.PLAIN), parsed_refs) | st.builds(
    Cond, st.just("exit"), parsed_refs, st.sampled_from(deps.OPS), st.integers(0, 255))
parsed = st.recursive(parsed_conditions, lambda inner: st.builds(Not, inner)
                      | st.builds(And, st.tuples(inner, inner)) | st.builds(Or, st.tuples(inner, inner)), max_leaves=5)


@settings(max_examples=400, deadline=None)
@given(parsed)
def test_format_then_parse_gives_the_expression_back(expr):
    text = deps.format_expr(expr)
    assert deps.format_expr(deps.parse(text)) == text  # nested And/Or are written with parentheses
