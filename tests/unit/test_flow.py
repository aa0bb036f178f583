"""flow.py, pure: a workflow document checked whole (every problem at once, with where it is) and
its steps put in dependency order."""

from __future__ import annotations

import pytest

from xce_lite.errors import SpecError
from xce_lite.workflow import flow
from xce_lite.workflow.flow import FlowError


def doc(**steps) -> dict:
    return {"name": "pipe", "steps": steps}


def test_a_pipeline_loads_in_dependency_order_with_vars_defaults_and_edges():
    loaded = flow.load({
        "name": "pipe",
        "vars": {"sims": 20, "data": "in.csv"},
        "defaults": {"queue": "normal", "run_limit": "10m"},
        "steps": {
            "report": {"command": "python3 report.py", "after": ["collect"]},
            "collect": {"command": ["python3", "collect.py"], "depend": "numdone(simulate, >= 18)",
                        "on_dep_fail": "pend"},
            "simulate": {"command": "python3 sim.py '${data}'", "array": "1-${sims}%5", "after": "prepare",
                         "retry": 2, "tasks": 2, "env": {"MODE": "fast"}},
            "prepare": {"command": ["python3", "prepare.py", "${data}"], "queue": "short"},
        }}, {"sims": "30"})
    assert [s.name for s in loaded.steps] == ["prepare", "simulate", "collect", "report"]
    prepare, simulate, collect, report = loaded.steps
    assert prepare.command == ("python3", "prepare.py", "in.csv") and prepare.depend is None
    assert prepare.options == {"queue": "short", "run_limit": "10m"}
    assert simulate.array == "[1-30]%5" and simulate.depend == "done(prepare)"
    assert simulate.command == ("python3", "sim.py", "in.csv")
    assert simulate.options == {"queue": "normal", "run_limit": "10m", "retry": 2, "tasks": "2",
                                "env": ["MODE=fast"]}
    assert collect.depend == "numdone(simulate, >= 18)" and collect.upstream == ("simulate",)
    assert collect.options["on_dep_fail"] == "pend"
    assert report.depend == "done(collect)" and report.upstream == ("collect",)


def test_after_and_depend_combine_and_wildcards_match_step_names():
    loaded = flow.load(doc(a={"command": "true"}, a2={"command": "true"}, b={"command": "true"},
                           c={"command": "true", "after": ["b"], "depend": "ended(a*) || exit(b)"}))
    c = loaded.step("c")
    assert c.depend == "done(b) && (ended(a*) || exit(b))" and c.upstream == ("b", "a", "a2")
    assert [s.name for s in loaded.steps][-1] == "c"


def test_a_cycle_is_named_step_by_step_and_nothing_loads():
    with pytest.raises(FlowError) as err:
        flow.load(doc(a={"command": "true", "after": ["c"]}, b={"command": "true", "after": ["a"]},
                      c={"command": "true", "depend": "done(b)"}, d={"command": "true"}))
    assert err.value.problems == [(("steps",), "the steps depend on each other in a cycle: a -> b -> c -> a")]


def test_a_step_that_depends_on_itself_is_refused():
    with pytest.raises(FlowError, match="step a depends on itself"):
        flow.load(doc(a={"command": "true", "after": ["a"]}))


def test_every_problem_is_reported_at_once_with_where_it_is():
    with pytest.raises(FlowError) as err:
        flow.load({"name": "bad name!", "extra": 1, "vars": {"n": "3"},
                   "steps": {"a": {"command": [], "after": ["nope"], "tasks": True, "shell": "x"},
                             "b": {"command": "x ${missing}", "array": "[5-1]", "depend": "done(a) &&"},
                             "c": {"command": "true", "depend": "done(zz*)", "name": "c2"},
                             "9d": {"command": "true"}}}, {"m": "1"})
    assert err.value.problems == [
        (("extra",), "unknown key; a flow has name, vars, defaults and steps"),
        (("name",), "the flow needs a name: letters, digits, _ . - (at most 63)"),
        (("vars",), "--set m=1: the flow declares no var m (it declares: n)"),
        (("steps", "a", "shell"), "unknown step key; a step has " + ", ".join(flow.STEP_KEYS)),
        (("steps", "a", "command"), "command is required: a list of words, or one string"),
        (("steps", "a", "tasks"), "tasks must be str (-n)"),
        (("steps", "a", "after"), "unknown step 'nope'; the steps are: a, b, c, 9d"),
        (("steps", "b", "command"), "${missing} is not defined: declare it under vars (or --set it)"),
        (("steps", "b", "array"), "array '[5-1]': the range 5-1 ends before it starts; write 1-5"),
        (("steps", "b", "depend"), "-w at position 11: expected a condition such as done(42)\n  done(a) &&\n"
                                   "            ^"),
        (("steps", "c", "name"), "unknown step key (the step's name is its job name); a step has "
                                 + ", ".join(flow.STEP_KEYS)),
        (("steps", "c", "depend"), "'zz*' names no step of this flow; the steps are: a, b, c, 9d"),
        (("steps", "9d"), "a step name starts with a letter, then letters, digits, _ . - (at most 63)"),
    ]
    assert "steps.a.after: unknown step 'nope'" in str(err.value)


@pytest.mark.parametrize("data, words", [
    ([], "a flow is a mapping"),
    ({"name": "x"}, "a flow needs steps"),
    ({"name": "x", "steps": {"a": "true"}}, "a step is a mapping"),
    ({"name": "x", "steps": {"a": {"command": "echo 'open"}}}, "cannot split the command"),
    ({"name": "x", "defaults": [1], "steps": {"a": {"command": "true"}}}, "defaults is a mapping"),
    ({"name": "x", "steps": {"a": {"command": "true", "array": "1-5%0"}}}, "throttle %0"),
])
def test_malformed_documents_say_what_is_wrong(data, words):
    with pytest.raises(FlowError, match=words):
        flow.load(data)


def test_a_dollar_is_written_twice_and_ids_in_conditions_are_existing_jobs():
    loaded = flow.load(doc(a={"command": "echo $$HOME", "depend": "done(42) && ended(b)"}, b={"command": "true"}))
    assert loaded.step("a").command == ("echo", "$HOME") and loaded.step("a").upstream == ("b",)


def test_a_thousand_step_chain_orders_quickly():
    steps = {f"s{i}": {"command": "true", "after": [f"s{i - 1}"]} if i else {"command": "true"} for i in range(1000)}
    loaded = flow.load(doc(**dict(reversed(list(steps.items())))))
    assert [s.name for s in loaded.steps] == [f"s{i}" for i in range(1000)]


# ---- the file, checked as `xce flow submit` checks it ---------------------------------------------

SIX_MISTAKES = """\
name: bad
vars: {n: "4"}
defaults: {run_limt: 10m}
steps:
  a:
    command: [echo, a]
    tasks: 0
    run_limit: 10x
  b:
    command: [echo, b]
    after: [a, nosuch]
    queue: nosuchq
    mem_limit: lots
  c:
    command: [echo, c]
    depend: "done(b) &&"
    array: "1-${n}%0"
  d:
    command: [echo, d]
    resreq: "select[[["
    app: nosuchapp
    stdout: .
    after: [e]
  e:
    command: [echo, e]
    after: [d]
"""


def test_the_file_checker_reports_every_mistake_at_once_with_its_file_line_and_step(tmp_path):
    from xce_lite.cli.flow import load_file

    path = tmp_path / "bad.yaml"
    path.write_text(SIX_MISTAKES)
    with pytest.raises(SpecError) as err:
        load_file(path, {}, (["normal", "short"], ["default", "hello"]))
    lines = str(err.value).splitlines()
    expected = [
        "steps (line 4): the steps depend on each other in a cycle: d -> e -> d",
        "defaults.run_limt (line 3): unknown option; defaults may set",
        "steps.a.tasks (line 7): '0': need 1 <= MIN <= MAX",
        "steps.a.run_limit (line 8): run limit (-W) '10x' is not a duration",
        "steps.b.after (line 11): unknown step 'nosuch'",
        "steps.b.queue (line 12): unknown queue 'nosuchq'; the queues are: normal, short",
        "steps.b.mem_limit (line 13): memory limit (-M) 'lots' is not a size",
        "steps.c.depend (line 16): -w at position 11: expected a condition",
        "steps.c.array (line 17): array '1-4%0': the throttle %0 must be a whole number of at least 1",
        "steps.d.resreq (line 20): -R \"select[[[\": at column 8",
        "steps.d.app (line 21): unknown application profile 'nosuchapp'; the profiles are: default, hello",
        "steps.d.stdout (line 22): '.' is a directory; name a file in it",
    ]
    for words in expected:
        assert sum(f"{path}: {words}" in line for line in lines) == 1, (words, lines)
    assert lines[-1] == "nothing was submitted; fix the file and submit it again"


def test_a_var_that_makes_a_bad_value_is_named_with_its_value(tmp_path):
    from xce_lite.cli.flow import load_file
    from xce_lite.shipped import shipped

    path = tmp_path / "flow.yaml"
    path.write_text((shipped("examples") / "pipeline" / "flow.yaml").read_text())
    with pytest.raises(SpecError) as err:
        load_file(path, {"sims": "0"})
    assert "steps.simulate.array (line 22): array '1-0%5': the range 1-0 ends before it starts; it must end at 1 " \
           "or more (written '1-${sims}%5', with sims=0)" in str(err.value)
    assert "write 0-1" not in str(err.value)
