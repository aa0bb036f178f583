"""Issue 15: the controller is a composition root over parts, not a class made of mixins. Each part
is given its dependencies in its constructor (the shared state, the seams, the other parts it
calls); none derives from another, and none holds the Controller (only core.py builds one, and
invariants.py names it for the type checker alone)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support import paths

CONTROLLER = paths.ROOT / "xce_lite" / "controller"


def _classes() -> Iterator[tuple[Path, ast.ClassDef]]:
    for path in sorted(CONTROLLER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                yield path, node


def test_the_controller_derives_from_nothing_and_no_part_from_another():
    controllers = [node for _path, node in _classes() if node.name == "Controller"]
    assert len(controllers) == 1 and controllers[0].bases == [], "Controller must not be made of mixins"
    ours = {node.name for _path, node in _classes()}
    inherited = [f"{path.relative_to(paths.ROOT)}: {node.name}({base.id})" for path, node in _classes()
                 for base in node.bases if isinstance(base, ast.Name) and base.id in ours]
    assert inherited == [], "a part derives from another part (a mixin): " + ", ".join(inherited)


def test_no_part_imports_the_controller_at_run_time():
    holders = []
    for path in sorted(CONTROLLER.rglob("*.py")):
        if path.name == "core.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:  # top level: TYPE_CHECKING blocks aside
            if isinstance(node, ast.ImportFrom) and node.module == "xce_lite.controller.core":
                holders.append(str(path.relative_to(paths.ROOT)))
    assert holders == [], f"these parts import the Controller: {holders}"
