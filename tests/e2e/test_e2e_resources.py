"""End to end: task ranges, -R, GPUs and queue policies through the real controller."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.cluster import Cluster, running_cluster
from tests.support.waiting import wait_until

CONFIG = f"""\
cluster: r{os.getpid()}
hosts:
  - name: alpha
    slots: 2
    mem: 1G
    gpus: 2
    attrs: {{model: EPYC}}
    tags: [avx512]
  - name: beta
    slots: 2
    mem: 512M
    resources: {{tmp: 10G}}
resources:
  tmp: {{kind: size}}
shared:
  lic_matlab: 1
queues:
  - name: normal
    default: true
  - name: short
    priority: 50
    run_limit: 1m
    max_tasks: 2
    user_running_limit: 1
  - name: betaonly
    hosts: [beta]
controller:
  tick: 1s
  grace: 1s
"""


@pytest.fixture
def rcluster():
    with running_cluster(config=CONFIG) as c:
        yield c


def env_of(c: Cluster, job_id: int, name: str) -> str:
    return (c.work / f"env-{job_id}").read_text().strip()


def test_a_task_range_takes_every_slot_free_across_hosts(rcluster: Cluster):
    job_id = rcluster.submit("sh", "-c", 'echo "$XCE_SLOTS $XCE_HOSTS" > env-$XCE_JOBID', options=("-n", "1,8"))
    assert rcluster.xce("wait", str(job_id)).returncode == 0
    job = rcluster.job(job_id)
    assert job["hosts"] == [["alpha", 2], ["beta", 2]] and job["slots"] == 4
    assert env_of(rcluster, job_id, "") == "4 alpha beta"


def test_gpus_are_handed_to_the_job(rcluster: Cluster):
    job_id = rcluster.submit("sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES" > env-$XCE_JOBID', options=("--gpus", "2"))
    assert rcluster.xce("wait", str(job_id)).returncode == 0
    assert env_of(rcluster, job_id, "") == "0,1"
    assert rcluster.job(job_id)["hosts"] == [["alpha", 1]]


def test_select_rusage_and_shared_counters_place_and_hold(rcluster: Cluster):
    on_beta = rcluster.submit("sleep", "300", options=("-R", "rusage[tmp=6G]"))
    assert rcluster.wait_state(on_beta, {"RUN"})["hosts"] == [["beta", 1]]
    second = rcluster.submit("true", options=("-R", "rusage[tmp=6G]"))
    wait_until(lambda: rcluster.job(second)["pend_reason"], 10, "a pend reason")
    assert rcluster.job(second)["pend_reason"] == "2 hosts: tmp needed 6G, free at most 4G"
    why = rcluster.ok("why", str(second))
    assert "beta: tmp needed 6G, free 4G" in why
    lic = rcluster.submit("sleep", "300", options=("-R", "select[avx512] rusage[lic_matlab=1/job]"))
    assert rcluster.wait_state(lic, {"RUN"})["hosts"] == [["alpha", 1]]
    other = rcluster.submit("true", options=("-R", "rusage[lic_matlab=1/job]"))
    wait_until(lambda: "lic_matlab" in (rcluster.job(other)["pend_reason"] or ""), 10, "a license reason")
    hosts = json.loads(rcluster.ok("hosts", "--json"))["hosts"]
    beta = next(h for h in hosts if h["name"] == "beta")
    assert beta["resources"]["tmp"]["reserved"] == 6 * 2**30
    assert "tmp" in rcluster.ok("hosts", "-l")
    rcluster.ok("kill", str(on_beta), str(lic))
    assert rcluster.xce("wait", str(second), str(other)).returncode == 0


def test_queue_ceilings_refuse_at_submit_and_apply_as_defaults(rcluster: Cluster):
    too_long = rcluster.xce("submit", "-q", "short", "-W", "2h", "--", "true")
    assert too_long.returncode == 2 and "ceiling of 0:01:00" in too_long.stderr
    too_wide = rcluster.xce("submit", "-q", "short", "-n", "3", "--", "true")
    assert too_wide.returncode == 2 and "at most 2 tasks" in too_wide.stderr
    capped = rcluster.submit("true", options=("-q", "short", "-n", "1,8"))
    assert rcluster.xce("wait", str(capped)).returncode == 0
    assert rcluster.job(capped)["slots"] == 1  # the per-user limit of 1 slot cuts the range


def test_queue_limits_and_hosts_hold_jobs_back_with_reasons(rcluster: Cluster):
    first = rcluster.submit("sleep", "300", options=("-q", "short"))
    rcluster.wait_state(first, {"RUN"})
    second = rcluster.submit("true", options=("-q", "short"))
    wait_until(lambda: rcluster.job(second)["pend_reason"], 10, "a pend reason")
    assert "running limit of 1 slots per user in queue short" in rcluster.job(second)["pend_reason"]
    beta_only = rcluster.submit("true", options=("-q", "betaonly", "-n", "2"))
    assert rcluster.xce("wait", str(beta_only)).returncode == 0
    assert rcluster.job(beta_only)["hosts"] == [["beta", 2]]
    rcluster.ok("kill", str(first))
    assert rcluster.xce("wait", str(second)).returncode == 0


def test_allocations_survive_a_controller_restart(rcluster: Cluster):
    holder = rcluster.submit("sleep", "300", options=("--gpus", "1"))
    rcluster.wait_state(holder, {"RUN"})
    rcluster.kill9_controller()
    rcluster.start()
    hosts = json.loads(rcluster.ok("hosts", "--json"))["hosts"]
    alpha = next(h for h in hosts if h["name"] == "alpha")
    assert alpha["gpus_free"] == [1]  # the running job's GPU 0 is still held after the restart
    second = rcluster.submit("sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES" > env-$XCE_JOBID', options=("--gpus", "1"))
    assert rcluster.xce("wait", str(second)).returncode == 0
    assert env_of(rcluster, second, "") == "1"
    rcluster.ok("kill", str(holder))
