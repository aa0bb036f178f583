"""Every command has help with an example and appears in the README; every example loads and runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from xce_lite.cli import main
from xce_lite.config import load_config
from xce_lite.tests.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _commands(group: click.Group, prefix: str = "xce") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        if isinstance(command, click.Group):
            found.extend(_commands(command, path))
        else:
            found.append((path, command))
    return found


@pytest.mark.parametrize("path, command", _commands(main), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_has_help_with_an_example_and_is_in_the_readme(path, command):
    assert command.help and "Example:" in command.help, f"{path} needs a docstring with an Example:"
    readme = (ROOT / "README.md").read_text()
    assert f"`{path}" in readme or f"{path} " in readme, f"{path} is not in README.md"


def test_the_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"    {ci}\n" in readme


def test_help_runs_without_a_home(tmp_path):
    result = subprocess.run([sys.executable, "-m", "xce_lite", "--help"], capture_output=True, text=True,
                            env={"XCE_HOME": str(tmp_path / "none"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and "submit" in result.stdout


def test_example_config_loads():
    config = load_config(EXAMPLES / "xce.yaml")
    assert config.default_queue.name == "normal" and [q.name for q in config.queues] == ["normal", "urgent"]


def test_example_job_runs(cluster: Cluster):
    job_id = cluster.submit("sh", str(EXAMPLES / "hello.sh"), options=("-J", "hello", "-o", "hello-%J.out"))
    assert cluster.xce("wait", str(job_id)).returncode == 0
    out = (cluster.work / f"hello-{job_id}.out").read_text()
    assert f"hello from job {job_id} (hello) in queue normal" in out


def test_quickstart_from_nothing_runs_an_example_job(idle_cluster: Cluster):
    env = dict(idle_cluster.env, XCE_HOME=str(idle_cluster.root / "qs"))
    try:
        result = idle_cluster.xce("quickstart", env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "Controller started" in result.stdout
        assert "DONE" in result.stdout and "hello from job 1" in result.stdout
        again = idle_cluster.xce("quickstart", env=env, timeout=120)  # a second run reuses the home
        assert again.returncode == 0 and "hello from job 2" in again.stdout
    finally:
        idle_cluster.xce("controller", "stop", env=env)
