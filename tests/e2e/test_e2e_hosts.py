"""End to end: hosts that go away and come back, through the real controller and real agents.

Local hosts stand in for remote ones here: each has an agent of its own (its own spool), and a
host "goes away" when its agent is killed while something holds its spool's lock, so that the
next agent cannot serve it until the test lets go. The same paths run over SSH in the remote tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, HostOutage, hosts_of, running_cluster
from tests.support.waiting import wait_until

CONFIG = """\
cluster: h{pid}
hosts:
  - {{name: a, slots: 1, mem: 1G}}
  - {{name: b, slots: 1, mem: 1G}}
queues:
  - {{name: normal, default: true}}
controller:
  tick: 1s
  grace: 1s
  host_lost_after: {lost_after}
  lease: 5s
  lease_margin: 1s
"""


@pytest.fixture
def hcluster(request):
    """Two local hosts with a lease of 5 s; a host out of reach is lost after `lost_after` (the param;
    default 7s)."""
    with running_cluster(config=CONFIG.format(pid=os.getpid(), lost_after=getattr(request, "param", "7s"))) as c:
        yield c


def test_a_host_out_of_reach_is_unreach_then_lost_and_its_job_is_requeued_elsewhere(hcluster: Cluster):
    log = hcluster.work / "attempts"
    job_id = hcluster.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; trap "exit 0" TERM; sleep 60 & wait')
    first = hcluster.wait_state(job_id, {"RUN"})
    assert first["hosts"] == [["a", 1]]
    with HostOutage(hcluster, "a"):
        wait_until(lambda: hosts_of(hcluster)["a"]["state"] == "unreach", 30, "host a to show unreach")
        wait_until(lambda: hcluster.job(job_id)["attempt"] == 2 and hcluster.job(job_id)["state"] == "RUN", 60,
                   "the job to run again, as attempt 2")
        second = hcluster.job(job_id)
        assert second["hosts"] == [["b", 1]]
        assert hosts_of(hcluster)["a"]["lost"] is True
        # the first copy stopped itself when a's lease ran out, before the job was requeued
        assert len(hcluster.supervisor_pids()) == 1
    wait_until(lambda: hosts_of(hcluster)["a"]["state"] == "ok", 60, "host a to come back")
    assert log.read_text().split() == ["1", "2"]
    assert hcluster.job(job_id)["state"] == "RUN" and hcluster.job(job_id)["attempt"] == 2
    hcluster.ok("kill", str(job_id))
    assert hcluster.xce("wait", str(job_id)).returncode == 1
    assert hcluster.job(job_id)["reason"].startswith("killed by")


@pytest.mark.parametrize("hcluster", ["5m"], indirect=True)
def test_a_job_keeps_running_while_its_agent_is_away_and_its_result_comes_back(hcluster: Cluster):
    marker: Path = hcluster.work / "done"
    release = hcluster.work / "release"  # the job ends only once its agent is away (within its lease)
    job_id = hcluster.submit("sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done; touch {marker}; exit 3")
    hcluster.wait_state(job_id, {"RUN"})
    with HostOutage(hcluster, hcluster.job(job_id)["hosts"][0][0]):
        release.touch()
        wait_until(marker.exists, 30, "the job to end while its host is out of reach")
        assert hcluster.job(job_id)["state"] == "RUN"  # nobody could tell the controller yet
    final = hcluster.wait_state(job_id, {"EXIT"}, timeout=60)
    assert final["exit_code"] == 3
