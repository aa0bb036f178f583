"""The simulator on the controller's own tick (sim/ticked.py): retries, host loss and return, a
controller's history replayed. Real parts: the real Controller and its store (a temp home), its
in-process scheduler, fake hosts behind the exec seam (the simulated world), the real CLI;
`check_invariants` after every tick."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.inproc import InProc
from xce_lite.controller.invariants import check_invariants
from xce_lite.sim.export import export_workload
from xce_lite.sim.ticked import TickSimulation
from xce_lite.sim.workload import load_workload

CONFIG = """cluster: lossy
hosts:
  - {name: n1, slots: 2, mem: 4G}
  - {name: n2, slots: 2, mem: 4G}
queues:
  - {name: normal, default: true}
controller: {tick: 1s, lease: 60s, lease_margin: 10s, host_lost_after: 120s}
"""
# flaky fails twice and is retried twice; n1 is lost at 200 (its jobs are requeued after 120 s),
# comes back at 600; then n2 is lost at 1500 for good, while the requeued jobs run there.
WORKLOAD = """jobs:
  - {submit: 0, name: flaky, runtime: 100, exit: 3, retry: 2}
  - {submit: 0, name: wide, n: 2, runtime: 1000}
  - {submit: 0, name: other, n: 2, runtime: 1000}
  - {submit: 50, name: late, runtime: 30}
hosts:
  - {host: n1, lost: 200, back: 600}
  - {host: n2, lost: 1500}
"""


def files(tmp_path: Path, config: str = CONFIG, workload: str = WORKLOAD) -> tuple[Path, Path]:
    c, w = tmp_path / "xce.yaml", tmp_path / "workload.yaml"
    c.write_text(config)
    w.write_text(workload)
    return c, w


def checked(sim: TickSimulation) -> None:
    check_invariants(sim.run.ctl, set())


def xce_sim(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xce_lite", "sim", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_a_workload_with_retries_and_host_losses_simulates_both(tmp_path):
    config, workload = files(tmp_path)
    sim = TickSimulation(config, load_workload(workload), after_tick=checked)
    try:
        sim.run_to_end()
        jobs = {o.name: o for o in sim.outcomes()}
        order = sim.dispatch_order()
        logs = list(sim.logs)
    finally:
        sim.close()
    flaky = jobs["flaky"]
    assert (flaky.state, flaky.exit_code, flaky.attempt) == ("EXIT", 3, 3), flaky  # 1 try + 2 retries
    assert [a for j, a, _ in order if j == flaky.id] == [1, 2, 3]
    # n1 went away at 200 holding jobs: they were requeued once it was surely lost, and ran again
    lost_n1 = [j for j, a, hosts in order if a == 1 and "n1" in hosts and j != flaky.id]
    assert lost_n1 and all(jobs_by_id(jobs)[j].attempt >= 2 for j in lost_n1)
    assert any("host n1 lost" in line for line in logs) and any("host n2 lost" in line for line in logs)
    # nothing was dispatched to n1 while it was out of reach, nor to n2 after it went for good
    for job_id, attempt, hosts in order:
        start = dispatch_time(jobs_by_id(jobs)[job_id], attempt)
        assert start is None or not ("n1" in hosts and 200 <= start < 600), (job_id, attempt, hosts)
    # n2's loss at 1500 ends or requeues what ran there; the run still ends: every job DONE or EXIT
    assert {o.state for o in jobs.values()} <= {"DONE", "EXIT"}
    assert jobs["late"].state == "DONE"


def jobs_by_id(jobs: dict) -> dict:
    return {o.id: o for o in jobs.values()}


def dispatch_time(outcome, attempt: int) -> float | None:
    return outcome.start if outcome.attempt == attempt else None


def test_the_cli_runs_the_tick_records_verifies_and_snapshots_such_a_workload(tmp_path):
    config, workload = files(tmp_path)
    result = xce_sim("run", config, workload, "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["engine"] == "tick" and figures["retried"] >= 3 and figures["states"].get("EXIT", 0) >= 1
    text = xce_sim("run", config, workload).stdout
    assert "host event: host n1 lost" in text
    rec = tmp_path / "run.rec"
    assert xce_sim("run", config, workload, "--output", rec).returncode == 0
    lines = [json.loads(line) for line in rec.read_text().splitlines()]
    assert lines[0]["engine"] == "tick" and lines[0]["xce_sim_recording"] == 2
    dispatched = [d for line in lines[1:] for d in line["dispatched"]]
    assert [d[1] for d in dispatched if d[0] == 1] == [1, 2, 3]  # flaky's three attempts, recorded
    assert any(r for line in lines[1:] for r in line["requeued"])  # the host loss's requeues
    same = xce_sim("run", config, workload, "--verify", rec)
    assert same.returncode == 0 and "verify: no difference" in same.stdout, same.stdout + same.stderr
    changed = rec.read_text().replace('"dispatched":[[1,1,[["n1"', '"dispatched":[[1,1,[["n2"', 1)
    assert changed != rec.read_text()
    (tmp_path / "changed.rec").write_text(changed)
    differs = xce_sim("run", config, workload, "--verify", tmp_path / "changed.rec")
    assert differs.returncode == 1 and "differs in dispatched" in differs.stdout, differs.stdout
    # `--tick` is accepted and changes nothing (it says it is no longer needed)
    ticked = xce_sim("run", config, workload, "--tick", "--verify", rec)
    assert ticked.returncode == 0 and "verify: no difference" in ticked.stdout
    assert "--tick is no longer needed" in ticked.stderr
    # a recording of the older format (the core-only engine) is refused, saying what to do
    old = tmp_path / "old.rec"
    old.write_text('{"config":"x","interval":1.0,"workload":"y","xce_sim_recording":1}\n')
    refused = xce_sim("run", config, workload, "--verify", old)
    assert refused.returncode == 2 and "format 1" in refused.stderr and "record it again" in refused.stderr


def test_a_snapshot_of_a_run_with_retries_and_a_host_loss_goes_on_exactly_as_the_whole_run(tmp_path):
    """Saved at 400 (n1 lost and its jobs requeued, flaky on its retries), taken up again: the rest of
    the recording is the whole run's, byte for byte, and so is the summary."""
    config, workload = files(tmp_path)
    whole, rest, snap = tmp_path / "whole.rec", tmp_path / "rest.rec", tmp_path / "mid.snap"
    full = xce_sim("run", config, workload, "--output", whole)
    assert full.returncode == 0, full.stderr
    half = xce_sim("run", config, workload, "--stop-at", "400", "--save", snap)
    assert half.returncode == 0, half.stderr
    state = json.loads(snap.read_text())["state"]
    assert state["now"] <= 400 and state["states"].get("RUN") and not (tmp_path / "mid.snap.partial").exists()
    resumed = xce_sim("run", config, workload, "--load", snap, "--output", rest)
    assert resumed.returncode == 0, resumed.stderr
    tail = rest.read_text().splitlines()[1:]
    assert tail and tail == whole.read_text().splitlines()[-len(tail):]
    assert json.loads(tail[0])["step"] == state["step"] + 1
    assert any(json.loads(line)["requeued"] for line in whole.read_text().splitlines()[1:-len(tail)])
    assert resumed.stdout == full.stdout
    other = tmp_path / "other.yaml"
    other.write_text(WORKLOAD.replace("runtime: 30", "runtime: 31"))
    wrong = xce_sim("run", config, other, "--load", snap)
    assert wrong.returncode == 2 and "is of another workload" in wrong.stderr


@pytest.mark.parametrize("hosts, words", [
    ("  - {host: n9, lost: 5}\n", "host event for 'n9', which the config does not have"),
    ("  - {host: n1, lost: 50, back: 20}\n", "`back` (20) must come after `lost` (50)"),
    ("  - {host: n1, when: 5}\n", "unknown field(s) when; `lost` is missing"),
])
def test_bad_host_events_say_which_and_what_to_write(tmp_path, hosts, words):
    config, workload = files(tmp_path, workload="jobs:\n  - {submit: 0, runtime: 5}\nhosts:\n" + hosts)
    result = xce_sim("run", config, workload)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert words in result.stderr, result.stderr


def test_a_controllers_exported_history_replays_to_the_same_decisions(tmp_path):
    """A real controller's history (in-process: the real tick, fake hosts), exported with `sim export`
    and simulated: which job ran where, in which order, as the controller decided it."""
    p = InProc(hosts=("h1", "h2", "h3"), slots=4, lease="10s", host_lost_after="40s")
    try:
        p.step(0.1)
        shapes = [(30, {"slots": 2}), (50, {"slots": 4}), (10, {}), (70, {"slots": 3}), (20, {"slots": 2}),
                  (40, {}), (25, {"slots": 4}), (5, {"slots": 1}), (60, {"slots": 2}), (15, {"slots": 3})]
        for i, (runtime, fields) in enumerate(shapes):
            p.submit(runtime=runtime, name=f"j{i}", **fields)
            if i % 3 == 2:
                p.step(1.0)
        for _ in range(400):
            p.step(1.0)
            check_invariants(p.ctl, set())
        real = [(job_id, tuple(h[0] if isinstance(h, list) else h for h in (data or {}).get("hosts", ())))
                for _, _, job_id, data in sorted(
                    (t, seq, job.id, data) for job in p.ctl.store.jobs(include_finished=True)
                    for seq, (t, kind, data) in enumerate(p.ctl.store.events(job.id)) if kind == "dispatched")]
        assert all(j.state == "DONE" for j in p.ctl.store.jobs(include_finished=True))
        out = tmp_path / "history.yaml"
        assert export_workload(p.home.store, out) == len(shapes)
        config = p.root / "xce.yaml"
        sim = TickSimulation(config, load_workload(out), after_tick=checked)
        try:
            sim.run_to_end()
            replayed = [(j, hosts) for j, _attempt, hosts in sim.dispatch_order()]
        finally:
            sim.close()
    finally:
        p.close()
    assert len(real) == len(shapes) and all(hosts for _, hosts in real)
    assert replayed == real


def test_a_controller_restart_in_the_middle_of_a_host_loss_runs_nothing_twice(tmp_path):
    """Faults in sequence: a retry, n1 cut off at 200, the controller restarted at 250 (before it
    could declare n1 lost), n1 back at 600, n2 lost for good at 1500; then to the end."""
    config, workload = files(tmp_path)
    sim = TickSimulation(config, load_workload(workload), after_tick=checked)
    try:
        sim.run_to_end(stop_at=250)
        assert "n1" in sim.run.dropped and sim.now <= 250
        sim.run.restart()
        sim.run_to_end()
        jobs = {o.name: o for o in sim.outcomes()}
        order = sim.dispatch_order()
        logs = list(sim.logs)
    finally:
        sim.close()
    attempts = [(job, attempt) for job, attempt, _ in order]
    assert len(attempts) == len(set(attempts)), "an attempt was dispatched twice"
    assert (jobs["flaky"].state, jobs["flaky"].attempt) == ("EXIT", 3)
    assert {o.state for o in jobs.values()} <= {"DONE", "EXIT"} and jobs["late"].state == "DONE"
    assert any("host n1 lost" in line for line in logs), logs
