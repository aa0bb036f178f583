"""The Python API against a real controller: the README's example runs as printed, a job submitted
from Python is the job `xce submit` makes, and errors are the CLI's kinds, through a controller
that stops and starts again under a Cluster kept open."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import readme
from tests.support.cluster import Cluster as LiveCluster
from xce_lite import errors
from xce_lite.pyapi import Cluster


def test_the_readme_example_runs_as_printed(cluster: LiveCluster) -> None:
    [code] = [b.text for b in readme.blocks() if b.kind == "python"]
    [expected] = [b.text for b in readme.blocks() if b.kind == "output"]
    assert "from xce_lite import Cluster" in code
    result = subprocess.run([sys.executable, "-c", code], cwd=cluster.work, env=cluster.env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected


def test_a_job_from_python_is_the_job_xce_submit_makes(cluster: LiveCluster) -> None:
    options = ["-J", "twin", "-n", "1,2", "-W", "10m", "-M", "256M", "--env", "COLOUR=blue", "-sp", "7",
               "-o", "twin-%J.out", "--retry", "2", "--retry-on", "3,4", "-R", "rusage[mem=64M]"]
    by_cli = cluster.submit("sh", "-c", "echo $COLOUR", options=tuple(options))
    with Cluster(cluster.home) as api:
        by_python = api.submit(["sh", "-c", "echo $COLOUR"], name="twin", tasks=(1, 2), run_limit="10m",
                               mem_limit="256M", env={"COLOUR": "blue"}, priority=7, stdout="twin-%J.out",
                               retry=2, retry_on=[3, 4], resreq="rusage[mem=64M]", cwd=str(cluster.work))
        jobs = {j["id"]: j for j in api.wait(by_cli, by_python)}
        assert api.output(by_python) == "blue\n"
        assert [j["id"] for j in api.jobs(by_python)] == [by_python]
        assert api.job(by_python)["effective"]
    fields = ("name", "min_slots", "max_slots", "run_limit", "mem_limit", "resreq", "command", "cwd", "retry", "state")
    assert {f: jobs[by_cli][f] for f in fields} == {f: jobs[by_python][f] for f in fields}
    assert jobs[by_python]["stdout"].endswith(f"twin-{by_python}.out")


def test_errors_are_the_cli_kinds_through_a_controller_restart(cluster: LiveCluster, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(cluster.work)  # where the jobs submitted without cwd= write their output
    with pytest.raises(errors.HomeError):
        Cluster(tmp_path / "nowhere")
    api = Cluster(cluster.home)
    try:
        with pytest.raises(errors.SpecError, match=r"run_limit \(-W\)"):
            api.submit(["true"], run_limit="soon")
        with pytest.raises(errors.SpecError, match="unknown submit option"):
            api.submit(["true"], walltime="1h")
        with pytest.raises(errors.NotFound):
            api.job(99_999)
        done = api.submit("true")
        api.wait(done)
        with pytest.raises(errors.TransitionError, match="already finished"):
            api.kill(done)
        slow = api.submit(["sleep", "30"])
        with pytest.raises(TimeoutError, match=f"{slow} "):
            api.wait(slow, timeout=1)

        cluster.ok("controller", "stop")  # the open connection dies under the Cluster
        with pytest.raises(errors.ControllerDown) as down:
            api.jobs()
        assert down.value.exit_code == 3
        cluster.start()
        assert [j["state"] for j in api.jobs(slow)] == ["RUN"]  # the same object reconnects
        assert api.kill(slow) == [f"Job <{slow}> is being terminated"]
        assert api.wait(slow)[0]["state"] == "EXIT"
    finally:
        api.close()


def test_flows_from_python(cluster: LiveCluster) -> None:
    flow = cluster.work / "pyflow.yaml"
    flow.write_text("name: pyflow\nvars: {word: hi}\nsteps:\n  a: {command: [echo, '${word}']}\n"
                    "  b: {command: [echo, b], after: [a]}\n")
    with Cluster(cluster.home) as api:
        reply = api.submit_flow(flow, word="hello")
        assert [s["step"] for s in reply["steps"]] == ["a", "b"]
        api.wait(*(s["id"] for s in reply["steps"]))
        assert api.output(reply["steps"][0]["id"]) == "hello\n"
        assert [s["state"] for s in api.flow("pyflow")["steps"]] == ["DONE", "DONE"]
        assert [f["name"] for f in api.flows()] == ["pyflow"]
        with pytest.raises(errors.TransitionError, match="nothing to rescue"):
            api.rescue_flow("pyflow")
    assert json.loads(cluster.ok("flow", "status", "pyflow", "--json"))["flow"]["name"] == "pyflow"
