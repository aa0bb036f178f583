"""Every command has help with an example and appears in the README; every example loads and runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import click
import pytest

from tests.support import paths
from tests.support.cluster import Cluster
from xce_lite.cli.main import main
from xce_lite.config import presets
from xce_lite.config.checks import review
from xce_lite.config.profiles import load_cluster

ROOT = paths.ROOT
EXAMPLES = paths.EXAMPLES


def _commands(group: click.Group, prefix: str = "xce") -> list[tuple[str, click.Command]]:
    found = []
    ctx = click.Context(group)  # the group is lazy (cli/main.py): ask it, do not read .commands
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
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


def test_every_example_config_and_preset_loads_without_a_warning():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == ["applications.yaml", "xce.yaml"]
    config, profiles = load_cluster(EXAMPLES / "xce.yaml")
    assert config.default_queue.name == "normal" and [q.name for q in config.queues] == ["normal", "urgent"]
    assert sorted(profiles) == ["default", "hello", "sweep"]
    assert review((config, profiles), []).to_json() == {"errors": [], "warnings": [], "changes": []}
    found = sorted(EXAMPLES.glob("presets/*.json"))
    assert [p.stem for p in found] == ["quick"]
    for path in found:
        assert presets.read_file(path).options["app"] in profiles


@pytest.fixture
def example_cluster():
    """A cluster home made of the example files as they are (its cluster name made unique)."""
    c = Cluster(config=(EXAMPLES / "xce.yaml").read_text().replace("cluster: lab", f"cluster: ex{os.getpid()}"))
    shutil.copy(EXAMPLES / "applications.yaml", c.home / "applications.yaml")
    c.env["XDG_CONFIG_HOME"] = str(c.root / "config")
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_example_job_runs_with_every_example_profile_and_preset(example_cluster: Cluster):
    c = example_cluster
    job_id = c.submit("sh", str(EXAMPLES / "hello.sh"), options=("-J", "hello", "-o", "hello-%J.out"))
    assert c.xce("wait", str(job_id)).returncode == 0
    out = (c.work / f"hello-{job_id}.out").read_text()
    assert f"hello from job {job_id} (hello) in queue normal" in out
    hello = c.submit("sh", str(EXAMPLES / "hello.sh"), options=("-app", "hello"))
    sweep = c.submit("sh", "-c", 'echo "$XCE_SLOTS tasks, niceness $(cut -d" " -f19 /proc/self/stat)"',
                     options=("-app", "sweep"))
    c.ok("preset", "import", str(EXAMPLES / "presets" / "quick.json"))
    quick = c.submit("sh", str(EXAMPLES / "hello.sh"), options=("--preset", "quick"))
    assert c.xce("wait", str(hello), str(sweep), str(quick)).returncode == 0
    out = (c.work / f"xce-{hello}.out").read_text()
    assert "application hello: hello in style plain, owner docs" in out
    assert f"getting ready for job {hello}\n" in out and f"job {hello} ended DONE\n" in out  # its hooks
    assert (c.work / f"xce-{sweep}.out").read_text() == "2 tasks, niceness 5\n"
    assert "application hello: hello in style loud" in (c.work / f"quick-{quick}.out").read_text()


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
