"""Issue 15: the host agent is a composition root over parts, not a class made of mixins. Each part
(exec/agent/: state, link, manager, zygote, lease, unitops, tasks, reads) is given in its
constructor the shared AgentState (shared.py) and the other parts it calls; none derives from
another, none holds the Agent (only main.py, which runs it, imports server.py), and a class uses
only attributes it defines itself: what another part has, it reaches through that part."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

from tests.support import paths

AGENT = paths.ROOT / "xce_lite" / "exec" / "agent"

# subclass -> (base, why it is a real is-a); exceptions derive from Exception, which is not ours
IS_A = {
    "UnitRecorder": ("JournalRecorder", "a supervisor in a systemd unit records to the same journal: only its "
                                        "`finished` differs (result.json for `post`), and it goes wherever a "
                                        "JournalRecorder goes"),
}


def _classes() -> Iterator[tuple[Path, ast.ClassDef]]:
    for path in sorted(AGENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                yield path, node


def _self_attributes(node: ast.ClassDef) -> tuple[set[str], set[str]]:
    """(names the class defines: methods, class attributes, __slots__, `self.X = ...` targets;
    names it reads as `self.X`)."""
    defined, used = set(), set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            defined.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            defined.add(item.target.id)
        elif isinstance(item, ast.Assign):
            for target in item.targets:
                if isinstance(target, ast.Name):
                    defined.add(target.id)
                    if target.id == "__slots__" and isinstance(item.value, ast.Tuple):
                        defined |= {e.value for e in item.value.elts if isinstance(e, ast.Constant)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            (defined if isinstance(sub.ctx, ast.Store) else used).add(sub.attr)
    return defined, used


def test_the_agent_derives_from_nothing_and_no_class_from_another_of_ours_but_a_real_is_a():
    agents = [node for path, node in _classes() if node.name == "Agent" and path.name == "server.py"]
    assert len(agents) == 1 and agents[0].bases == [], "the Agent must not be made of mixins"
    ours = {node.name for _path, node in _classes()}
    inherited = {node.name: base.id for _path, node in _classes() for base in node.bases
                 if isinstance(base, ast.Name) and base.id in ours}
    assert inherited == {name: base for name, (base, _why) in IS_A.items()}, \
        f"a class derives from another of ours (a mixin?): {inherited}; name a real is-a in IS_A, with why"


def test_each_class_reads_only_the_attributes_it_defines():
    """The mixins' trait: a method reading `self.X` that another class sets. A part reaches the
    shared state as `self.state.X`, and another part's method as `self.part.method()`."""
    strangers = []
    for path, node in _classes():
        defined, used = _self_attributes(node)
        inherited = IS_A.get(node.name, (None,))[0]
        if inherited is not None:
            defined |= _self_attributes(next(n for _p, n in _classes() if n.name == inherited))[0]
        strangers += [f"{path.name}: {node.name}.{name}" for name in sorted(used - defined)]
    assert strangers == [], f"these read attributes their class does not define: {strangers}"


def test_no_part_imports_the_agent():
    holders = []
    for path in sorted(AGENT.glob("*.py")):
        if path.name in ("server.py", "main.py"):  # main builds and runs it
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == "server":
                holders.append(path.name)
    assert holders == [], f"these parts import the Agent: {holders}"


def test_the_shared_state_sets_every_slot_and_refuses_a_new_field(tmp_path):
    from xce_lite.exec.agent.shared import AgentState

    state = AgentState(str(tmp_path), "h")
    assert [name for name in AgentState.__slots__ if not hasattr(state, name)] == []
    try:
        state.unit_sate = {}  # type: ignore[attr-defined]  # a typo: no part may grow the state by one
    except AttributeError:
        pass
    else:
        raise AssertionError("AgentState took an attribute it does not declare")


def test_the_agent_routes_each_op_to_its_part_and_refuses_the_others(tmp_path):
    """In process, on a real spool: every op of the protocol reaches a part; an unknown op, one
    that is not a string (unhashable, even) and an unreadable line get an answer, not a crash."""
    from xce_lite.exec.agent.jsonl import dumps, loads
    from xce_lite.exec.agent.server import OPS, Agent

    agent = Agent(str(tmp_path), "h")
    try:
        assert set(agent.ops) == set(OPS)
        assert all(not hasattr(handler.__self__, "ops") for handler in agent.ops.values())  # parts, not the Agent
        lines = [{"id": 1, "op": "ping"}, {"id": 2, "op": "list"}, {"id": 3, "op": "nope"}, {"id": 4, "op": ["x"]},
                 {"id": 5, "op": "forget", "units": ["u1"]}, {"id": 6, "op": "signal", "unit": "u1", "signal": "TERM"}]
        for line in lines:
            agent.handle_line(dumps(line))
        agent.handle_line(b"{not json")
        replies = [loads(line) for line in agent.state.out]
        assert [r.get("id") for r in replies] == [1, 2, 3, 4, 5, 6, None]
        assert [r.get("ok") for r in replies[:6]] == [True, True, False, False, True, True]
        assert replies[1]["units"] == [] and replies[5]["found"] is False
        assert "unknown op 'nope'" in replies[2]["error"] and "unknown op ['x']" in replies[3]["error"]
        assert replies[6]["event"] == "error" and "unreadable request" in replies[6]["error"]
    finally:
        os.close(agent.state.jfd)
