"""Every block of README.md is what it says: the tour and every other command block run as printed in
a fresh home (each documented output line and exit code checked), the set-up commands are what CI
runs, each YAML sample loads as what it claims to be, the completion lines give each shell a script.
Blocks that need root and namespaces (the practice cluster, a host of one's own) run in
tests/e2e/test_readme_e2e.py. How a block is marked: tests/support/readme.py."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.support import paths, readme

BLOCKS = readme.blocks()
E2E = ("e2e", "e2e-host", "e2e-shared")  # e2e-shared: tests/e2e/test_shared_lab.py


def _ids(blocks: list[readme.Block]) -> list[str]:
    return [f"line{b.line}" for b in blocks]


RUN = [b for b in BLOCKS if b.kind == "run" and not set(b.options) & set(E2E)]


def test_every_block_is_marked_and_the_tour_is_among_them():
    kinds = {b.kind for b in BLOCKS}
    assert kinds == set(readme.KINDS), f"kinds used: {kinds}"
    assert BLOCKS[0].kind == "setup" and BLOCKS[0].lines == ["pip install . && xce quickstart"]
    assert any(b.commands() and b.commands()[0].text.startswith("xce quickstart") for b in RUN)
    e2e = [b for b in BLOCKS if set(b.options) & set(E2E)]
    assert e2e, "the practice cluster's block runs in tests/e2e"


@pytest.fixture
def fresh_home():
    """A new user's home: short (socket paths), empty, with `xce` on PATH; what ran there is stopped."""
    root = Path(tempfile.mkdtemp(prefix="xce-readme-"))
    home = root / "home"
    home.mkdir()
    env = readme.environment(home, readme.shims(root / "bin"))
    try:
        yield home, env
    finally:
        readme.stop_home(home / ".xce", env)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("block", RUN, ids=_ids(RUN))
def test_a_command_block_runs_as_printed_in_a_fresh_home(block: readme.Block, fresh_home):
    home, env = fresh_home
    outcomes = readme.run(block, home, env)
    wrong = readme.problems(outcomes, home)
    assert not wrong, "\n\n".join(wrong)


def test_the_setup_blocks_are_what_ci_runs_and_what_exists():
    ci = (paths.ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    setups = [b for b in BLOCKS if b.kind == "setup"]
    seen_ci = False
    for block in setups:
        for command in block.commands():
            text = command.text.split("  #")[0].strip()
            if text == ci:
                seen_ci = True
                continue
            if text.startswith("python3 -m pytest "):
                words = shlex.split(text)[3:]
                assert (paths.ROOT / words[0]).exists(), f"README.md line {command.line}: no {words[0]}"
                collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *words],
                                           cwd=paths.ROOT, capture_output=True, text=True, timeout=300)
                assert collected.returncode == 0 and "::" in collected.stdout, \
                    f"README.md line {command.line}: `{text}` selects no test"
                continue
            install, _, then = text.partition(" && ")
            assert install in ("pip install .", "pip install -e '.[test]'", "pip install '.[test]'"), text
            assert then in ("xce quickstart", "python3 -m pytest"), f"README.md line {command.line}: {text}"
    assert seen_ci, "the README must give .ci/run's command as it is"


def _cluster_sample(doc: dict, merged: dict) -> dict:
    """Samples add to one cluster, in README order: hosts replace hosts, the rest is merged."""
    for key, value in doc.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    return merged


def test_every_yaml_sample_loads_as_what_it_is(tmp_path):
    from xce_lite.config.cluster import ClusterConfig
    from xce_lite.config.profiles import load_cluster
    from xce_lite.shipped import shipped
    from xce_lite.workflow import flow

    merged = {"cluster": "readme", "hosts": [{"name": "h", "slots": 1, "mem": "1G"}],
              "queues": [{"name": "normal", "default": True}]}
    samples = [b for b in BLOCKS if b.kind == "yaml"]
    assert {b.options[0] for b in samples} == {"cluster", "applications", "flow", "prometheus"}
    for block in samples:
        doc = yaml.safe_load(block.text)
        where = f"README.md line {block.line}"
        if block.options[0] == "cluster":
            merged = _cluster_sample(doc, merged)
            ClusterConfig.model_validate(merged)
        elif block.options[0] == "applications":
            (tmp_path / "xce.yaml").write_text(yaml.safe_dump(merged))
            (tmp_path / "applications.yaml").write_text(block.text)
            _config, profiles = load_cluster(tmp_path / "xce.yaml")
            assert set(doc["applications"]) <= set(profiles), where
        elif block.options[0] == "prometheus":  # a scrape config pointing at `xce web`'s default address
            [target] = doc["scrape_configs"][0]["static_configs"][0]["targets"]
            assert target == "127.0.0.1:8090", where
        else:
            shipped_file = shipped("examples").joinpath(*block.options[1].removeprefix("examples/").split("/"))
            assert doc == yaml.safe_load(shipped_file.read_text()), f"{where}: not what {block.options[1]} holds"
            assert flow.load(doc).steps, where


def test_the_completion_lines_give_each_shell_its_script(fresh_home):
    _home, env = fresh_home
    [block] = [b for b in BLOCKS if b.kind == "completion"]
    lines = {c.text.split("  #")[0].strip(): c for c in block.commands()}
    shells = {"bash": 'eval "$(_XCE_COMPLETE=bash_source xce)"', "zsh": 'eval "$(_XCE_COMPLETE=zsh_source xce)"',
              "fish": "_XCE_COMPLETE=fish_source xce | source"}
    assert set(lines) == set(shells.values())
    defined = subprocess.run(["bash", "-c", shells["bash"] + "\ncomplete -p xce"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert defined.returncode == 0 and "_xce_completion" in defined.stdout, defined.stderr
    for shell, word in (("zsh", "compdef"), ("fish", "complete --no-files --command xce")):
        script = subprocess.run(["bash", "-c", f"_XCE_COMPLETE={shell}_source xce"], env=env, capture_output=True,
                                text=True, timeout=60)
        assert script.returncode == 0 and word in script.stdout, (shell, script.stdout[:200])
        if shutil.which(shell):
            check = subprocess.run([shell, "-c", shells[shell]], env=env, capture_output=True, text=True, timeout=60)
            assert check.returncode == 0, (shell, check.stderr)
