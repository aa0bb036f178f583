"""The tests' own layout: a test module imports shared helpers from `tests.support` only, never from
another test module (a helper imported from a test module drags that module's fixtures and imports
along, and is easily changed for its own tests alone). What two test modules share lives once in
tests/support/ (builders, the test-host fixture, the remote cluster, the agent's journal reader...).

Every import counts, wherever it is (inside a function too), and relative ones are resolved against
the importing module's package. Modules under tests/support/ obey the same rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import paths

TESTS = paths.ROOT / "tests"
ALLOWED = "tests.support"


def module_name(path: Path) -> str:
    parts = path.relative_to(paths.ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of_tests(source: str, module: str, package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute name) of every `tests.*` module that `source` imports, anywhere in it.
    `from PKG import x`, PKG a package of tests/, names `PKG.x`; a relative import is resolved
    against `module`'s package."""
    found: list[tuple[int, str]] = []
    base = module.split(".") if package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if (paths.ROOT / Path(*target.split("."))).is_dir():  # `from tests.exec import test_agent`
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, name) for line, name in found if name == "tests" or name.startswith("tests.")]


def is_allowed(name: str) -> bool:
    return name == ALLOWED or name.startswith(ALLOWED + ".")


def wrong_imports() -> list[str]:
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        module = module_name(path)
        for line, name in imports_of_tests(path.read_text(), module, path.name == "__init__.py"):
            if not is_allowed(name):
                wrong.append(f"{path.relative_to(paths.ROOT)}:{line} imports {name}")
    return wrong


def test_test_modules_import_helpers_from_tests_support_only():
    wrong = wrong_imports()
    assert not wrong, ("test modules must not import from other test modules; move what they share, once, "
                       "into tests/support/ and import it from there:\n  " + "\n  ".join(wrong))


@pytest.mark.parametrize(("source", "module", "expected"), [
    ("from tests.e2e.test_e2e_remote import close\n", "tests.e2e.test_lab", ["tests.e2e.test_e2e_remote"]),
    ("import tests.store.test_store as s\n", "tests.store.test_x", ["tests.store.test_store"]),
    ("from .test_agent import journal\n", "tests.exec.test_agent_tree", ["tests.exec.test_agent"]),
    ("from . import test_agent\n", "tests.exec.test_x", ["tests.exec.test_agent"]),
    ("from .. import e2e\n", "tests.exec.test_x", ["tests.e2e"]),
    ("from tests import sched\n", "tests.unit.test_x", ["tests.sched"]),
    ("from tests.store import test_store\n", "tests.unit.test_x", ["tests.store.test_store"]),
    ("def f():\n    from tests.sched.test_sched_core import job\n", "tests.sim.test_x",
     ["tests.sched.test_sched_core"]),
], ids=["absolute", "import-as", "relative", "relative-package", "parent-package", "from-tests", "from-layer",
        "inside-a-function"])
def test_the_check_sees_every_form_of_import(source, module, expected):
    """The rule's own check finds absolute, relative, package-relative and lazy imports of a test module."""
    found = [name for _, name in imports_of_tests(source, module)]
    assert found == expected
    assert not any(is_allowed(name) for name in found)


@pytest.mark.parametrize("source", [
    "from tests.support.cluster import Cluster\n",
    "from tests.support import paths\n",
    "from ..support.store import spec\n",
    "import tests.support.waiting\n",
    "from xce_lite.sched.core import schedule\n",
], ids=["support-module", "support-package", "support-relative", "import-support", "package"])
def test_the_check_lets_support_and_the_package_through(source):
    assert all(is_allowed(name) for _, name in imports_of_tests(source, "tests.store.test_x"))
