"""Projects and fair share in the simulator: the controller's own policy (its tick) on a simulated clock.

The example under examples/sim/fairshare shows two users evened out; the same workload without the
queue's fair share runs in submit order. Project limits pend with the controller's reasons, and a
request no limit could allow is rejected at submit, as the controller would.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import paths
from xce_lite.controller.invariants import check_invariants
from xce_lite.sim.ticked import TickSimulation
from xce_lite.sim.workload import load_workload

EXAMPLE = paths.EXAMPLES / "sim" / "fairshare"


def simulation(config, workload) -> TickSimulation:
    return TickSimulation(config, workload, after_tick=lambda sim: check_invariants(sim.run.ctl, set()))


def run_until(sim: TickSimulation, t: float) -> None:
    sim.run_to_end(stop_at=t)


def running_by_user(sim: TickSimulation) -> dict[str, int]:
    """Jobs holding hosts now (dispatched or running), by user."""
    counts: dict[str, int] = {}
    for job in sim.outcomes(include_finished=False):
        if job.state in ("DISP", "RUN"):
            counts[job.user] = counts.get(job.user, 0) + 1
    return counts


def test_fair_share_evens_out_two_users_where_submit_order_would_not(tmp_path):
    workload = load_workload(EXAMPLE / "workload.yaml")
    fair = simulation(EXAMPLE / "xce.yaml", workload)
    try:
        run_until(fair, 601)  # alice's first four ended at 600; the next four were dispatched then
        assert running_by_user(fair) == {"alice": 2, "bob": 2}
        run_until(fair, 1201)
        assert running_by_user(fair) == {"alice": 2, "bob": 2}  # each half the cluster while both wait
    finally:
        fair.close()
    plain_text = (EXAMPLE / "xce.yaml").read_text().replace("    fairshare:", "    # fairshare:")
    (tmp_path / "xce.yaml").write_text(plain_text)
    plain = simulation(tmp_path / "xce.yaml", workload)
    try:
        run_until(plain, 1201)
        assert running_by_user(plain) == {"alice": 4}
    finally:
        plain.close()


def test_a_fair_share_run_saved_midway_goes_on_exactly_as_the_whole_run(tmp_path):
    def sim(*args):
        return subprocess.run([sys.executable, "-m", "xce_lite", "sim", "run", EXAMPLE / "xce.yaml",
                               EXAMPLE / "workload.yaml", *args], capture_output=True, text=True, timeout=120)

    whole, rest, snap = tmp_path / "whole.rec", tmp_path / "rest.rec", tmp_path / "mid.snap"
    assert sim("--output", whole).returncode == 0
    assert sim("--stop-at", "900", "--save", snap).returncode == 0
    resumed = sim("--load", snap, "--output", rest)
    assert resumed.returncode == 0, resumed.stderr
    tail = rest.read_text().splitlines()[1:]
    assert tail and tail == whole.read_text().splitlines()[-len(tail):]
    assert json.loads(snap.read_text())["state"]["states"].get("RUN")  # taken up midway, with jobs running


CONFIG = """cluster: simproj
hosts:
  - {name: g1, slots: 8, mem: 16G, gpus: 4}
queues:
  - {name: normal, default: true}
projects:
  - {name: lab, members: [alice, bob], limits: {gpus: 3}}
  - {name: lab/vision, members: [bob], limits: {jobs: 1}}
default_project: lab
"""
WORKLOAD = """jobs:
  - {submit: 0, user: bob, project: lab/vision, R: "rusage[gpus=2]", runtime: 100}
  - {submit: 1, user: bob, project: lab/vision, runtime: 10}
  - {submit: 2, user: alice, R: "rusage[gpus=2]", runtime: 10}
  - {submit: 3, user: alice, project: lab/vision, runtime: 10}
  - {submit: 4, user: alice, R: "rusage[gpus=4]", runtime: 10}
"""


def test_project_limits_roll_up_and_refuse_in_the_simulator_as_in_the_controller(tmp_path):
    (tmp_path / "xce.yaml").write_text(CONFIG)
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    sim = simulation(tmp_path / "xce.yaml", load_workload(tmp_path / "w.yaml"))
    try:
        run_until(sim, 5)
        jobs = {j.id: j for j in sim.outcomes()}
        assert jobs[1].state == "RUN"
        assert sim.run.live_reason(2) == "project lab/vision: running jobs 1 of 1 in use"
        assert sim.run.live_reason(3) == "project lab: gpus 2 of 3 in use, the job needs 2"  # lab/vision's count in lab
        rejected = dict(sim.rejected)  # workload row -> why: the controller refused them at submit
        assert sorted(rejected) == [4, 5] and set(jobs) == {1, 2, 3}
        assert "not a member of project lab/vision" in rejected[4]
        assert "project lab allows at most 3 gpus" in rejected[5]
        sim.run_to_end()
        assert {j.id: j.state for j in sim.outcomes()} == {1: "DONE", 2: "DONE", 3: "DONE"}
    finally:
        sim.close()
