"""Dependencies point one way: parse every module's imports with `ast` and fail on a wrong arrow.

Every import counts, including those inside functions (a lazy import is still an arrow) and relative
ones (resolved against the importing module's package). The rules:

- `sched/*` and `lifecycle` import only the standard library, `models`, `errors` and `sched.*`;
- the merge (`config.merge`, `merge_values`, `merge_view`) and the workflow logic (`workflow.deps`,
  `deps_eval`, `arrays`, `gate`) are pure too: the standard library, `models`, `errors`,
  `quantities`, `sched.*`, each other;
- `store/*` never imports `exec`, `sched`, `controller`, `api`, `cli` or `sim`;
- `exec/*` never imports `store`, `sched`, `controller`, `api`, `cli` or `sim`;
- `config/*`, `workflow/*` and `api/*` never import `controller`, `store`, `cli` or `sim`;
- `web/*` (the dashboard) reads through the API only: never `store`, `controller`, `sched`, `exec`,
  `cli` or `sim`; only `cli` and `web` import it, and only `web` imports its libraries;
- only `cli/*` (and `__main__`) import `cli`, but the Python API (`pyapi`), which builds job specs
  with `cli.submit` and flow submissions with `cli.flow`; nothing imports `sim` but `sim` and `cli`;
- `exec/agent/` is shipped alone to hosts (as one file): it imports only the standard library and
  itself, relatively;
- SQL runs through apsw in `store/` alone: no other module imports apsw;
- every package's `__init__` is a docstring alone (importing a package loads nothing else), but the
  root's PEP 562 `__getattr__`, which imports `xce_lite.pyapi` when `Cluster` is first asked for;
- `xce_lite.cli.main` and `from xce_lite import Cluster` import nothing heavy on their way in (`xce
  submit` must start fast): no pydantic, apsw, fabric, yaml, nor the web's libraries.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import xce_lite

PACKAGE_DIR = Path(xce_lite.__file__).parent
ROOT = "xce_lite"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _is_module(name: str) -> bool:
    """Whether `name` (xce_lite.something) is a module or package in the source tree."""
    rel = Path(*name.split(".")[1:])
    return (PACKAGE_DIR / rel).with_suffix(".py").is_file() or (PACKAGE_DIR / rel / "__init__.py").is_file()


def imports_of(source: str, module: str, package: bool = False) -> set[str]:
    """Absolute names of every module `source` imports, anywhere in it.

    `from pkg import name` counts as importing `pkg.name` when that is a module of ours, else `pkg`.
    """
    found: set[str] = set()
    current_package = module if package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = current_package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if base.split(".")[0] == ROOT and _is_module(candidate):
                    found.add(candidate)
                else:
                    found.add(base)
    return found


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py")
                  if not {"tests", "__pycache__"} & set(p.relative_to(PACKAGE_DIR).parts))  # bundle.local_file


def all_imports() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p.read_text(encoding="utf-8"), module_name(p), is_package(p))
            for p in sources()}


def is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(rule_for: str, modules: dict[str, set[str]], allowed) -> list[str]:
    return [f"{module} imports {target}" for module, targets in sorted(modules.items())
            if within(module, rule_for) for target in sorted(targets) if not allowed(target)]


# ---- the checker itself -----------------------------------------------------------------------


def test_imports_of_sees_every_kind_of_import() -> None:
    source = """
import os, json as j
from xce_lite import errors
from xce_lite import quantities as units
from xce_lite.store.db import connect
from . import resreq
from .core import schedule
from .. import models
def later():
    import apsw
    from xce_lite.exec import host
"""
    assert imports_of(source, "xce_lite.sched.thing") == {
        "os", "json", "xce_lite.errors", "xce_lite.quantities", "xce_lite.store.db", "xce_lite.sched.resreq",
        "xce_lite.sched.core", "xce_lite.models", "apsw", "xce_lite.exec.host"}


def test_violations_names_each_wrong_arrow() -> None:
    modules = {"xce_lite.sched.core": {"os", "xce_lite.store.db"}, "xce_lite.cli.main": {"xce_lite.store.db"}}
    assert violations("xce_lite.sched", modules, lambda t: not within(t, "xce_lite.store")) == [
        "xce_lite.sched.core imports xce_lite.store.db"]


def test_the_walk_finds_the_layers() -> None:
    modules = all_imports()
    for expected in ("xce_lite.sched.core", "xce_lite.lifecycle", "xce_lite.store.db", "xce_lite.store.jobs",
                     "xce_lite.exec.host", "xce_lite.cli.main"):
        assert expected in modules
    assert not any(name.startswith("xce_lite.tests") for name in modules)


# ---- the arrows -------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["xce_lite.sched", "xce_lite.lifecycle"])
def test_pure_core_imports_only_stdlib_models_errors_and_sched(layer: str) -> None:
    def allowed(target: str) -> bool:
        return is_stdlib(target) or within(target, "xce_lite.models", "xce_lite.errors", "xce_lite.sched")

    assert violations(layer, all_imports(), allowed) == []


PURE_HELPERS = ("xce_lite.models", "xce_lite.errors", "xce_lite.quantities", "xce_lite.sched")


PURE_LOGIC = ("xce_lite.config.merge", "xce_lite.config.merge_values", "xce_lite.config.merge_view",
              "xce_lite.workflow.deps", "xce_lite.workflow.deps_eval", "xce_lite.workflow.arrays",
              "xce_lite.workflow.gate")


@pytest.mark.parametrize("module", PURE_LOGIC)
def test_the_merge_and_the_workflow_logic_are_pure(module: str) -> None:
    def allowed(target: str) -> bool:
        return is_stdlib(target) or within(target, *PURE_HELPERS, *PURE_LOGIC)

    assert violations(module, all_imports(), allowed) == []


@pytest.mark.parametrize(("layer", "never"), [
    ("xce_lite.store", ("exec", "sched", "controller", "api", "cli", "sim")),
    ("xce_lite.exec", ("store", "sched", "controller", "api", "cli", "sim")),
    ("xce_lite.config", ("controller", "store", "cli", "sim")),
    ("xce_lite.workflow", ("controller", "store", "cli", "sim")),
    ("xce_lite.api", ("controller", "store", "cli", "sim")),
    ("xce_lite.controller", ("cli", "sim")),
    ("xce_lite.web", ("store", "controller", "sched", "exec", "cli", "sim")),
])
def test_layers_never_import_upwards(layer: str, never: tuple[str, ...]) -> None:
    banned = tuple(f"xce_lite.{name}" for name in never)
    assert violations(layer, all_imports(), lambda t: not within(t, *banned)) == []


# The Python API builds what it sends with the CLI's own code, so a job submitted either way is the same.
PYAPI_USES = ("xce_lite.cli.submit", "xce_lite.cli.flow")


def test_only_the_cli_imports_the_cli_or_the_simulator() -> None:
    outside = {name: targets for name, targets in all_imports().items()
               if not within(name, "xce_lite.cli", "xce_lite.sim", "xce_lite.__main__")}
    wrong = violations(ROOT, outside, lambda t: not within(t, "xce_lite.cli", "xce_lite.sim"))
    assert wrong == [f"xce_lite.pyapi imports {t}" for t in sorted(PYAPI_USES)]


WEB_LIBRARIES = ("starlette", "uvicorn", "jinja2")


def test_only_the_cli_imports_the_web_and_only_the_web_its_libraries() -> None:
    modules = all_imports()
    outside = {n: t for n, t in modules.items() if not within(n, "xce_lite.web", "xce_lite.cli")}
    assert violations(ROOT, outside, lambda t: not within(t, "xce_lite.web", *WEB_LIBRARIES)) == []
    cli = {n: t for n, t in modules.items() if within(n, "xce_lite.cli")}
    assert violations(ROOT, cli, lambda t: not within(t, *WEB_LIBRARIES)) == []


# The test-host harness is the one package with a public face (`from xce_lite import testhosts`): it
# is standard library only and never on the CLI's or the controller's path.
FACES = {"xce_lite/testhosts/__init__.py"}


def _is_lazy_api(node: ast.stmt, name: str) -> bool:
    """The root package's PEP 562 `__getattr__`, importing nothing but the Python API, lazily."""
    if name != "xce_lite/__init__.py" or not isinstance(node, ast.FunctionDef) or node.name != "__getattr__":
        return False
    imported = {n.module for n in ast.walk(node) if isinstance(n, ast.ImportFrom)}
    return imported == {"xce_lite.pyapi"} and not any(isinstance(n, ast.Import) for n in ast.walk(node))


def test_package_inits_are_docstrings_only() -> None:
    heavy = []
    for init in sorted(PACKAGE_DIR.rglob("__init__.py")):
        name = str(init.relative_to(PACKAGE_DIR.parent))
        body = ast.parse(init.read_text(encoding="utf-8")).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        constants = all((isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)) or _is_lazy_api(n, name)
                        for n in body)
        if not constants and name not in FACES:
            heavy.append(name)
    assert heavy == [], "a package __init__ must hold only its docstring (and constants such as __version__)"


def test_the_host_agent_imports_only_the_standard_library_and_itself_relatively() -> None:
    modules = {name: targets for name, targets in all_imports().items() if within(name, "xce_lite.exec.agent")}
    assert "xce_lite.exec.agent.server" in modules, "the walk found no agent package"
    assert violations("xce_lite.exec.agent", modules,
                      lambda t: is_stdlib(t) or within(t, "xce_lite.exec.agent")) == []
    absolute = [f"{path.name} imports {node.module or node.names[0].name} absolutely"
                for path in sorted((PACKAGE_DIR / "exec" / "agent").glob("*.py"))
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
                and not is_stdlib(node.module if isinstance(node, ast.ImportFrom) else node.names[0].name)]
    assert absolute == []


def test_only_the_store_runs_sql() -> None:
    outside = {name: targets for name, targets in all_imports().items() if not within(name, "xce_lite.store")}
    assert violations(ROOT, outside, lambda t: not within(t, "apsw", "sqlite3")) == []


@pytest.mark.parametrize("statement", ["import xce_lite.cli.main", "from xce_lite import Cluster"])
def test_the_cli_and_the_python_api_load_nothing_heavy(statement: str) -> None:
    heavy = ["pydantic", "apsw", "fabric", "paramiko", "yaml", *WEB_LIBRARIES, "anyio", "h11", "prometheus_client",
             "playwright"]
    probe = (
        f"import sys, json\n{statement}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"`{statement}` loaded: {result.stdout.strip()}"


def test_the_lazy_api_check_refuses_anything_else() -> None:
    allowed = ast.parse("def __getattr__(name):\n    from xce_lite.pyapi import Cluster\n    return Cluster\n")
    heavy = ast.parse("def __getattr__(name):\n    from xce_lite.store import jobs\n    return jobs\n")
    assert _is_lazy_api(allowed.body[0], "xce_lite/__init__.py")
    assert not _is_lazy_api(allowed.body[0], "xce_lite/web/__init__.py")
    assert not _is_lazy_api(heavy.body[0], "xce_lite/__init__.py")
