"""One YAML loader for every file xce_lite reads (config/yamlfile.py): a key given twice in a mapping
is refused with the file and both lines, a file that is not UTF-8 is refused with the file and the
line (exit 2, never "internal error"), through the real commands: `xceadmin check` and
`xce controller start` on the configurations kept in tests/data/configs/, `xce flow submit --check`
and `xce sim run` on files written here. Preset files (JSON, standard library only) get the same
two refusals from their own reader (`xce submit --preset`, `xce preset show`, `xce preset import`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import paths
from xce_lite.config import yamlfile
from xce_lite.errors import ConfigError, SpecError

DATA = paths.DATA / "configs"

CASES = [
    ("duplicate_key", "xce.yaml: key `controller` appears twice in the same mapping, at line 6 and line 10; YAML "
                      "would keep only the last one and silently drop the first: merge them into one"),
    ("duplicate_profile", "applications.yaml: key `sim` appears twice in the same mapping, at line 2 and line 8"),
    ("not_utf8", "xce.yaml: not UTF-8 text (line 4, column 14: invalid continuation byte); save it as UTF-8"),
    ("not_utf8_apps", "applications.yaml: not UTF-8 text (line 3, column 19: invalid continuation byte)"),
]


def run(*argv: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60, env=env,
                          cwd=cwd)


@pytest.mark.parametrize("case, message", CASES, ids=[c for c, _ in CASES])
def test_xceadmin_check_refuses_the_file_with_its_lines(case, message):
    result = run("xce_lite.cli.admin", "--home", str(DATA / case), "check")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{DATA / case}/{message}" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("case, message", CASES, ids=[c for c, _ in CASES])
def test_the_controller_refuses_to_start_on_it_and_says_why(case, message, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(DATA / case, home)
    result = run("xce_lite", "controller", "start", env={**os.environ, "XCE_HOME": str(home)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{home}/{message}" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert not (home / "xce.sock").exists()


@pytest.mark.parametrize("content, message", [
    (b"name: t\nsteps:\n  a:\n    command: [echo, a]\n  a:\n    command: [echo, b]\n",
     "flow.yaml: key `a` appears twice in the same mapping, at line 3 and line 5"),
    (b"name: t\nsteps:\n  a:\n    command: [echo, \"\xe9\"]\n", "flow.yaml: not UTF-8 text (line 4, column 22"),
], ids=["duplicate", "not_utf8"])
def test_a_flow_file_is_refused_the_same_way(content, message, tmp_path):
    (tmp_path / "flow.yaml").write_bytes(content)
    result = run("xce_lite", "flow", "submit", "--check", "flow.yaml", cwd=tmp_path,
                 env={**os.environ, "XCE_HOME": str(tmp_path / "none")})
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "internal error" not in result.stderr


def test_a_workload_is_refused_the_same_way(tmp_path):
    (tmp_path / "w.yaml").write_text("jobs:\n  - {submit: 0, name: a, runtime: 5}\n"
                                     "  - {submit: 0, name: b, runtime: 5, name: c}\n")
    result = run("xce_lite", "sim", "run", str(paths.EXAMPLES / "sim/gpu/xce.yaml"), "w.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert "workload w.yaml: key `name` appears twice in the same mapping, on line 3" in result.stderr


def test_anchors_merge_keys_and_nesting():
    text = ("base: &b {x: 1}\n"
            "one: {<<: *b, <<: *b, y: 2}\n"  # a merge key may repeat
            "loop: &l [*l]\n"  # a document may refer to itself
            "list:\n  - {k: 1}\n  - {k: 1, k: 2}\n"
            "'one': again\n")
    with pytest.raises(ConfigError) as err:
        yamlfile.parse(text, "f.yaml")
    lines = str(err.value).splitlines()
    assert lines[0].startswith("f.yaml: key `k` appears twice in the same mapping, on line 6;")
    assert lines[1].startswith("f.yaml: key `one` appears twice in the same mapping, at line 2 and line 7;")
    data, root = yamlfile.parse("a: 1\nb: [1, 1]\n", "f.yaml")
    assert data == {"a": 1, "b": [1, 1]} and isinstance(root, yaml.MappingNode)
    assert yamlfile.parse("", "f.yaml") == (None, None)
    with pytest.raises(SpecError, match=r"^w.yaml is not valid YAML: "):
        yamlfile.parse("a: [\n", "w.yaml", SpecError)


@pytest.mark.parametrize("content, message", [
    (b'{"schema": 1, "name": "p", "description": "caf\xe9", "options": {}}',
     "p.json: not UTF-8 text (line 1, column 47: invalid continuation byte); save it as UTF-8"),
    (b'{"schema": 1, "name": "p",\n "options": {"queue": "a", "queue": "b"}}',
     "p.json: key 'queue' appears twice in the same object; JSON would keep only the last one"),
], ids=["not_utf8", "duplicate"])
def test_a_preset_file_is_refused_the_same_way(content, message, tmp_path):
    (tmp_path / "xce" / "presets").mkdir(parents=True)
    (tmp_path / "xce" / "presets" / "p.json").write_bytes(content)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "XCE_HOME": str(tmp_path / "none")}
    for argv in (("submit", "--preset", "p", "true"), ("preset", "show", "p")):
        result = run("xce_lite", *argv, env=env, cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    imported = run("xce_lite", "preset", "import", str(tmp_path / "xce" / "presets" / "p.json"), env=env, cwd=tmp_path)
    assert imported.returncode == 2 and message in imported.stderr, imported.stderr
