"""The CLI imports only what the command it runs uses (issue 18): `xce submit -- true` against a real
controller, `xce --help` and completing a command name load no other command's module, no heavy
library (pydantic, apsw, fabric, yaml...), and for --help not even the client. Each command runs in
a child process, which then reports its sys.modules. And the lazy group's table stays true: each
summary gives the same one-line help as the command's own docstring, at every terminal width.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.utils import make_default_short_help

from tests.support.cluster import Cluster
from xce_lite.cli.main import COMMANDS, main

# The child runs the real `main` as `xce` would, then writes the modules it holds (before json is
# imported for the writing).
CHILD = """
import sys
from xce_lite.cli.main import main
code = None
try:
    main(sys.argv[2:], prog_name="xce")
except SystemExit as end:
    code = end.code
loaded = sorted(sys.modules)
import json
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "modules": loaded}, f)
"""
BASELINE = "import sys, json; print(json.dumps(sorted(sys.modules)))"
HEAVY = ("pydantic", "apsw", "fabric", "paramiko", "yaml", "starlette", "uvicorn", "anyio", "h11", "psutil",
         "prometheus_client", "multiprocessing", "http", "secrets")
HELP_PATH = {"xce_lite", "xce_lite.cli", "xce_lite.cli.main", "xce_lite.cli.base", "xce_lite.errors"}
SUBMIT_PATH = HELP_PATH | {"xce_lite.cli.submit", "xce_lite.cli.complete", "xce_lite.api", "xce_lite.api.client",
                           "xce_lite.home", "xce_lite.home.paths"}


def _loaded(tmp_path, env: dict, *args: str) -> tuple[int, set[str]]:
    out = tmp_path / "modules.json"
    result = subprocess.run([sys.executable, "-c", CHILD, str(out), *args], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert out.exists(), result.stderr
    doc = json.loads(out.read_text())
    return doc["code"], set(doc["modules"])


def _check(modules: set[str], allowed_ours: set[str], baseline: set[str]) -> None:
    ours = {m for m in modules if m.split(".")[0] == "xce_lite"}
    assert ours == allowed_ours, f"unexpected: {sorted(ours - allowed_ours)}; missing: {sorted(allowed_ours - ours)}"
    heavy = sorted(m for m in modules - baseline if m.split(".")[0] in HEAVY)
    assert heavy == [], f"heavy modules loaded: {heavy}"
    libraries = {m.split(".")[0] for m in modules - baseline} - {"xce_lite", "click"}
    stdlib = set(sys.stdlib_module_names) | {"_json", "_socket", "_hashlib"}
    assert {name for name in libraries if name.lstrip("_") not in stdlib and name not in stdlib} == set()


@pytest.fixture
def baseline(tmp_path) -> set[str]:
    result = subprocess.run([sys.executable, "-c", BASELINE], capture_output=True, text=True, timeout=60,
                            check=True, cwd=tmp_path)
    return set(json.loads(result.stdout))


def test_submit_loads_only_its_own_path(cluster: Cluster, tmp_path, baseline):
    code, modules = _loaded(tmp_path, cluster.env, "submit", "--", "true")
    assert code in (0, None)
    _check(modules, SUBMIT_PATH, baseline)
    assert cluster.ok("jobs", "-a").count("true") == 1  # it was stored


def test_help_and_command_name_completion_load_no_command(tmp_path, baseline):
    env = {"PATH": "/usr/bin:/bin", "XCE_HOME": str(tmp_path / "none"), "PYTHONPATH": os.environ["PYTHONPATH"]}
    code, modules = _loaded(tmp_path, env, "--help")
    assert code in (0, None)
    _check(modules, HELP_PATH, baseline)
    completing = dict(env, _XCE_COMPLETE="bash_complete", COMP_WORDS="xce su", COMP_CWORD="1")
    result = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "c.json")], env=completing, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert "plain,submit" in result.stdout and "plain,suspend" in result.stdout, result.stderr
    _check(set(json.loads((tmp_path / "c.json").read_text())["modules"]), HELP_PATH, baseline)


def test_the_help_lists_every_command_as_the_commands_would_themselves():
    ctx = click.Context(main)
    listed = main.get_help(ctx)
    for name, (module, attribute, summary) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command.name == name and command is getattr(sys.modules[module], attribute), name
        for width in range(1, 80):  # click shortens to the terminal's width
            assert make_default_short_help(summary, width) == command.get_short_help_str(width), (name, width)
        assert f"  {name} " in listed
    assert main.get_help(ctx) == listed  # the same once every command is loaded


def test_submit_reads_its_option_flags_from_its_own_options_not_from_presets():
    from xce_lite.cli.submit import flags
    from xce_lite.config.presets import OPTIONS

    assert list(flags()) == list(OPTIONS)  # the same keys in the same order: a preset holds any of them
    assert {k: f for k, f in flags().items() if k != "hold"} == {k: v[0] for k, v in OPTIONS.items() if k != "hold"}
