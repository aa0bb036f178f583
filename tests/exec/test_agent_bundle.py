"""The agent as hosts get it: ONE file that exec/bundle.py generates from the package exec/agent/.

The file is built here, copied into an empty directory and run as hosts run it (`python -S -E
FILE ...`, with no xce_lite importable), with this interpreter and, where there is one, the
machine's own python3, which may be another version: the file carries sources, never bytecode.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xce_lite.exec import bundle

PYTHONS = list(dict.fromkeys(p for p in (sys.executable, "/usr/bin/python3") if os.path.exists(p)))
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH: nothing of xce_lite can be imported


@pytest.fixture
def shipped(tmp_path) -> Path:
    """The agent's file alone in a directory of its own, as a host keeps its copy."""
    return bundle.install(tmp_path / "agents")


@pytest.fixture
def empty(tmp_path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


def run(python: str, *argv: str | Path, cwd: Path, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-S", "-E", *map(str, argv)], input=stdin, capture_output=True, text=True,
                          cwd=cwd, env=CLEAN_ENV, timeout=timeout, check=False)


def unit_dir(tmp_path: Path, python: str, name: str, code: str) -> Path:
    """A prepared UNIT_DIR (spec.json, no spool) for `exec UNIT_DIR`: results go to files in it."""
    d = tmp_path / name
    d.mkdir()
    spec = {"unit": name, "argv": [python, "-c", code], "env": {"PATH": "/usr/bin:/bin"}, "cwd": str(tmp_path),
            "stdout": str(tmp_path / f"{name}.out"), "stderr": None, "run_limit": None, "mem_limit": None,
            "grace": 1.0, "host_dir": str(d)}
    (d / "spec.json").write_text(json.dumps(spec))
    return d


# ---------------------------------------------------------------- the file


def test_the_bundle_is_the_same_bytes_whoever_builds_it():
    data, name = bundle.agent_copy()
    assert bundle.build() == data and name.startswith("agent-") and name.endswith(".py")
    other = subprocess.run([sys.executable, "-c", "import sys; from xce_lite.exec import bundle; "
                            "sys.stdout.write(bundle.agent_copy()[1])"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True, timeout=60)
    assert other.stdout == name


def test_the_bundle_holds_every_module_as_source_and_no_bytecode():
    namespace: dict = {"__name__": "not_main"}  # defines LOADER and MODULES, runs nothing
    exec(compile(bundle.build(), "agent.py", "exec"), namespace)
    modules = dict(namespace["MODULES"])
    assert sorted(modules) == sorted(p.stem for p in bundle.modules())
    assert {"__init__", "main", "server", "steps", "util"} <= modules.keys() and "loader" not in modules
    for name, text in modules.items():
        assert text == (bundle.PACKAGE_DIR / f"{name}.py").read_text(encoding="utf-8")
    assert namespace["LOADER"] == bundle.HEADER + (bundle.PACKAGE_DIR / "loader.py").read_text(encoding="utf-8")


def test_a_changed_or_added_module_changes_the_hash(tmp_path, monkeypatch):
    package = tmp_path / "agent"
    shutil.copytree(bundle.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bundle, "PACKAGE_DIR", package)
    names = [bundle.agent_copy()[1]]
    assert names[0] == bundle.agent_copy()[1]
    with open(package / "util.py", "a") as f:
        f.write("# a comment is a change\n")
    names.append(bundle.agent_copy()[1])
    (package / "extra.py").write_text('"""A new module."""\n')
    names.append(bundle.agent_copy()[1])
    with open(package / "loader.py", "a") as f:
        f.write("\n")
    names.append(bundle.agent_copy()[1])
    assert len(set(names)) == 4


def test_no_module_of_the_package_imports_outside_the_standard_library_or_absolutely():
    found = []
    for path in sorted(bundle.PACKAGE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                # the loader is the file's top: it runs before there is a package to import from
                if node.level != 1 or path.stem == "loader":
                    found.append(f"{path.name}: from {'.' * node.level}{node.module or ''} import ...")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                found += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in sys.stdlib_module_names]
    assert found == []


# ---------------------------------------------------------------- the file, run as hosts run it


@pytest.mark.parametrize("python", PYTHONS)
def test_the_file_serves_hello_from_an_empty_directory_and_runs_on_as_bytecode(python, shipped, empty, tmp_path):
    spool = tmp_path / "spool"
    done = run(python, shipped, "serve", "--spool", spool, "--mode", "plain", cwd=empty,
               stdin='{"id": 1, "op": "hello"}\n{"id": 2, "op": "list"}\n')
    assert done.returncode == 0, done.stderr
    hello, listed = (json.loads(line) for line in done.stdout.splitlines())
    assert hello["ok"] and hello["version"] == 3 and hello["mode"] == "plain" and listed == {
        "id": 2, "ok": True, "units": []}
    tag = subprocess.run([python, "-c", "import sys; print(sys.implementation.cache_tag)"], capture_output=True,
                         text=True, check=True).stdout.strip()
    [compiled] = [p.name for p in (spool / "bin").iterdir() if p.name != "xce"]
    assert compiled == f"{shipped.stem}.{tag}.pyc"  # compiled on the host, by the host's Python
    assert list(empty.iterdir()) == [] and sorted(p.name for p in shipped.parent.iterdir()) == [shipped.name]


@pytest.mark.parametrize("python", PYTHONS)
def test_the_file_and_its_bytecode_exec_a_unit(python, shipped, empty, tmp_path):
    spool = tmp_path / "spool"
    run(python, shipped, "serve", "--spool", spool, "--mode", "plain", cwd=empty)  # EOF at once: compiles
    [compiled] = [p for p in (spool / "bin").iterdir() if p.suffix == ".pyc"]
    for code, form in ((shipped, "source"), (compiled, "bytecode")):
        unit = unit_dir(tmp_path, python, f"by-{form}", f"print('hi from {form}'); raise SystemExit(7)")
        done = run(python, code, "exec", unit, cwd=empty)
        assert done.returncode == 0, done.stderr
        assert json.loads((unit / "result.json").read_text())["exit_code"] == 7
        assert (tmp_path / f"by-{form}.out").read_text() == f"hi from {form}\n"


def test_a_units_exec_loads_none_of_the_servers_modules(shipped, empty, tmp_path):
    """A unit's interpreter starts once per job: `exec` imports what it runs, not serve's modules."""
    spool = tmp_path / "spool"
    run(sys.executable, shipped, "serve", "--spool", spool, "--mode", "plain", cwd=empty)
    [compiled] = [p for p in (spool / "bin").iterdir() if p.suffix == ".pyc"]
    done = run(sys.executable, "-X", "importtime", compiled, "exec", tmp_path / "no-such-unit", cwd=empty)
    assert done.returncode == 2 and "no spec.json" in done.stderr
    loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"xce_agent.steps", "xce_agent.supervisor", "xce_agent.watch", "xce_agent.hooks"} <= loaded
    assert not loaded & {"xce_agent.server", "xce_agent.dbus", "xce_agent.probe", "xce_agent.state", "json", "enum"}


def test_a_traceback_from_the_bytecode_shows_the_lines_of_the_modules_and_of_the_file(shipped, empty, tmp_path):
    """The compiled form holds no source: a traceback's lines come from the shipped file."""
    spool = tmp_path / "spool"
    run(sys.executable, shipped, "serve", "--spool", spool, "--mode", "plain", cwd=empty)
    [compiled] = [p for p in (spool / "bin").iterdir() if p.suffix == ".pyc"]
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "spec.json").write_text('{"unit": ')
    for code in (shipped, compiled):
        done = run(sys.executable, code, "exec", torn, cwd=empty)
        assert done.returncode == 1 and "ValueError" in done.stderr
        assert f'File "{shipped}/steps.py"' in done.stderr  # named by module, inside the shipped file
        assert 'spec = read_json(os.path.join(unit_dir, "spec.json"))' in done.stderr  # with its line
        assert "sys.exit(boot(globals()))" in done.stderr  # the file's own top, at its line
