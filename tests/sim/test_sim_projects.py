"""Projects and fair share in the simulator: the controller's policy on a simulated clock.

The example under examples/sim/fairshare shows two users evened out; the same workload without the
queue's fair share runs in submit order. Project limits pend with the controller's reasons, and a
request no limit could allow is rejected at submit, as the controller would.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import paths
from xce_lite.config.profiles import load_cluster
from xce_lite.sim.engine import Simulator
from xce_lite.sim.workload import load_workload

EXAMPLE = paths.EXAMPLES / "sim" / "fairshare"


def run_until(sim: Simulator, t: float) -> None:
    while sim.next_instant() is not None and sim.next_instant() <= t:
        sim.step()


def running_by_user(sim: Simulator) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in sim.running.values():
        counts[job.entry.user] = counts.get(job.entry.user, 0) + 1
    return counts


def test_fair_share_evens_out_two_users_where_submit_order_would_not(tmp_path):
    config, profiles = load_cluster(EXAMPLE / "xce.yaml")
    workload = load_workload(EXAMPLE / "workload.yaml")
    fair = Simulator(config, profiles, workload)
    run_until(fair, 600)  # alice's first four ended at 600; the next four started then
    assert running_by_user(fair) == {"alice": 2, "bob": 2}
    run_until(fair, 1200)
    assert running_by_user(fair) == {"alice": 2, "bob": 2}  # each half the cluster while both wait
    plain_text = (EXAMPLE / "xce.yaml").read_text().replace("    fairshare:", "    # fairshare:")
    (tmp_path / "xce.yaml").write_text(plain_text)
    plain = Simulator(*load_cluster(tmp_path / "xce.yaml"), workload)
    run_until(plain, 1200)
    assert running_by_user(plain) == {"alice": 4}


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
    assert json.loads(snap.read_text())["state"]["fairshare"]


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
    sim = Simulator(*load_cluster(tmp_path / "xce.yaml"), load_workload(tmp_path / "w.yaml"))
    run_until(sim, 5)
    jobs = {j.id: j for j in sim.jobs}
    assert jobs[1].state == "RUN"
    assert jobs[2].reason == "project lab/vision: running jobs 1 of 1 in use"
    assert jobs[3].reason == "project lab: gpus 2 of 3 in use, the job needs 2"  # lab/vision's GPUs count in lab
    assert jobs[4].state == "REJECTED" and "not a member of project lab/vision" in jobs[4].reason
    assert jobs[5].state == "REJECTED" and "project lab allows at most 3 gpus" in jobs[5].reason
    while sim.step() is not None:
        pass
    assert {j.id: j.state for j in sim.jobs} == {1: "DONE", 2: "DONE", 3: "DONE", 4: "REJECTED", 5: "REJECTED"}
