"""End to end: workflow files through the real controller (submit all or nothing, status, rescue),
and the example pipeline, on this machine and on real systemd test hosts over SSH."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.support import paths
from tests.support.cluster import Cluster, hosts_ok
from tests.support.remote import close, remote_config, started_cluster
from tests.support.waiting import wait_until

PIPELINE = paths.EXAMPLES / "pipeline"


def write_flow(c: Cluster, text: str, name: str = "flow.yaml") -> Path:
    path = c.work / name
    path.write_text(textwrap.dedent(text))
    return path


def status(c: Cluster, name: str) -> dict:
    return json.loads(c.ok("flow", "status", "--json", name))["flow"]


def all_jobs(c: Cluster) -> dict:
    return json.loads(c.ok("jobs", "--json", "-a"))


def test_a_flow_runs_its_steps_in_order_and_a_rescue_runs_only_what_did_not_finish(cluster: Cluster):
    c = cluster
    path = write_flow(c, """\
        name: rescue-me
        vars: {marks: marks}
        steps:
          start:
            command: [sh, -c, "echo start > start.txt"]
          sweep:
            command: [sh, -c, 'test ! -e ${marks}/fail-$XCE_ARRAY_INDEX && echo $XCE_ARRAY_INDEX >> ran.txt']
            array: "1-4"
            after: [start]
          merge:
            command: [sh, -c, "cat ran.txt > merged.txt"]
            after: [sweep]
          publish:
            command: [sh, -c, "echo published > published.txt"]
            depend: "done(merge) && ended(start)"
        """)
    marks = c.work / "marks"
    marks.mkdir()
    (marks / "fail-2").touch()
    (marks / "fail-4").touch()
    out = c.ok("flow", "submit", str(path))
    assert out.startswith("Flow <rescue-me> is submitted: start <1>, sweep <2[]>, merge <6>, publish <7>.")
    assert c.xce("wait", "1", "2", "6", "7").returncode == 1
    flow = status(c, "rescue-me")
    assert [(s["step"], s["state"]) for s in flow["steps"]] == [
        ("start", "DONE"), ("sweep", "EXIT"), ("merge", "EXIT"), ("publish", "EXIT")]
    assert flow["steps"][1]["states"] == {"DONE": 2, "EXIT": 2}
    drawn = c.ok("flow", "status", "rescue-me")
    assert "└─ sweep" in drawn and "2[1-4]" in drawn and "      └─ publish" in drawn
    merge = json.loads(c.ok("jobs", "--json", "6"))["jobs"][0]
    # cancelled once the first element failed, while others still ran
    assert merge["reason"].startswith("dependency can never be satisfied: done(sweep): sweep (array 2) has ")
    assert "EXIT" in merge["reason"] and merge["reason"].endswith("of 4 (can never hold)")
    (marks / "fail-2").unlink()
    (marks / "fail-4").unlink()
    rescued = c.ok("flow", "rescue", "rescue-me")
    assert rescued.startswith("Flow <rescue-me> is rescued: sweep <8[]>, merge <10>, publish <11>; kept (DONE): "
                              "start.")
    assert c.xce("wait", "8", "10", "11").returncode == 0
    flow = status(c, "rescue-me")
    assert flow["rescue_of"] == 1
    assert [(s["step"], s["id"], s["state"]) for s in flow["steps"]] == [
        ("start", 1, "DONE"), ("sweep", 8, "DONE"), ("merge", 10, "DONE"), ("publish", 11, "DONE")]
    assert flow["steps"][1]["indices"] == "[2,4]"  # only the elements that had failed ran again
    assert sorted((c.work / "merged.txt").read_text().split()) == ["1", "2", "3", "4"]
    assert (c.work / "published.txt").read_text() == "published\n"
    again = c.xce("flow", "rescue", "rescue-me")
    assert again.returncode == 1 and "every step ended DONE; there is nothing to rescue" in again.stderr


def test_a_rescue_waits_until_nothing_of_the_flow_runs(cluster: Cluster):
    c = cluster
    path = write_flow(c, """\
        name: slow
        steps:
          wait: {command: [sleep, "60"]}
        """)
    c.ok("flow", "submit", str(path))
    busy = c.xce("flow", "rescue", "slow")
    assert busy.returncode == 1 and "still has unfinished steps (wait)" in busy.stderr
    c.ok("kill", "1")
    assert c.xce("wait", "1").returncode == 1
    assert "wait <2>" in c.ok("flow", "rescue", "slow")
    c.ok("kill", "2")


@pytest.mark.parametrize("text, words", [
    ("""\
        name: loop
        steps:
          a: {command: "true", after: [c]}
          b: {command: "true", after: [a]}
          c: {command: "true", after: [b]}
        """, "flow.yaml: steps (line 2): the steps depend on each other in a cycle: a -> b -> c -> a"),
    ("""\
        name: typo
        steps:
          a: {command: "true"}
          b:
            command: "true"
            after: [aa]
        """, "flow.yaml: steps.b.after (line 6): unknown step 'aa'; the steps are: a, b"),
    ("""\
        name: bad
        steps:
          a: {command: "true", depend: "done(a) &&"}
        """, "steps.a.depend (line 3): -w at position 11: expected a condition"),
    ("""\
        name: big
        steps:
          a: {command: "true", array: "1-20000"}
        """, "more than 10000 elements"),
])
def test_a_bad_flow_file_is_refused_whole_with_lines_and_nothing_is_submitted(cluster: Cluster, text, words):
    c = cluster
    result = c.xce("flow", "submit", str(write_flow(c, text)))
    assert result.returncode == 2 and words in result.stderr, result.stderr
    assert "nothing was submitted" in result.stderr
    assert all_jobs(c) == {"schema": 1, "jobs": [], "arrays": []}


def test_a_step_the_controller_refuses_refuses_the_whole_flow(cluster: Cluster):
    c = cluster
    path = write_flow(c, """\
        name: half
        steps:
          fine: {command: "true"}
          wrong: {command: "true", tasks: "64", after: [fine]}
        """)  # the file is fine; only the controller knows that no host has 64 slots
    result = c.xce("flow", "submit", str(path))
    assert result.returncode == 2 and "step wrong:" in result.stderr and "64" in result.stderr, result.stderr
    assert all_jobs(c)["jobs"] == []
    missing = c.xce("flow", "status", "half")
    assert missing.returncode == 2 and "you have no flow named 'half'" in missing.stderr


def run_example(c: Cluster, out: Path, sims: int) -> dict:
    result = c.ok("flow", "submit", str(PIPELINE / "flow.yaml"), "--set", f"out={out}", "--set", f"sims={sims}",
                  "--set", "samples=20000")
    assert result.startswith("Flow <pi> is submitted")

    def finished():
        flow = status(c, "pi")
        return flow if all(s["state"] in ("DONE", "EXIT") for s in flow["steps"]) else None

    return wait_until(finished, 240, "the example pipeline to finish")


def test_the_example_pipeline_runs_to_completion(cluster: Cluster):
    c = cluster
    out = c.work / "pi"
    flow = run_example(c, out, 20)
    assert [(s["step"], s["state"]) for s in flow["steps"]] == [
        ("prepare", "DONE"), ("simulate", "DONE"), ("collect", "DONE"), ("report", "DONE")]
    assert flow["steps"][1]["states"] == {"DONE": 20}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sims"] == 20 and 3.0 < summary["pi"] < 3.3
    assert (out / "report.txt").read_text().startswith("pi ~ 3.")
    assert len(list((out / "logs").glob(f"{flow['steps'][1]['id']}_*.out"))) == 20
    assert c.ok("flow", "submit", "--check", str(PIPELINE / "flow.yaml")).splitlines() == [
        "prepare", "simulate[1-20]%5  after done(prepare)", "collect  after numdone(simulate, == *)",
        "report  after done(collect)"]


def test_the_example_pipeline_runs_to_completion_on_ssh_test_hosts(systemd_hosts, testhosts_root):
    c = started_cluster(remote_config(systemd_hosts), testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        out = c.work / "pi"
        flow = run_example(c, out, 8)
        assert [(s["step"], s["state"]) for s in flow["steps"]] == [
            ("prepare", "DONE"), ("simulate", "DONE"), ("collect", "DONE"), ("report", "DONE")]
        elements = json.loads(c.ok("jobs", "--json", "--elements", str(flow["steps"][1]["id"])))["jobs"]
        assert {e["hosts"][0][0] for e in elements} <= {h.name for h in systemd_hosts}
        assert json.loads((out / "summary.json").read_text())["sims"] == 8
        assert os.path.commonpath([out, testhosts_root]) == str(testhosts_root)
    finally:
        close(c)
