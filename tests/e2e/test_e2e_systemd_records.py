"""End to end over SSH on systemd test hosts whose agents record direct units' ends themselves
(hosts with `unit_accounting: false`; no ExecStopPost): faults in sequence, the agent killed, the jobs
ending with no agent, the agent back (the controller reconnects it), then the controller killed
and started again. The exit statuses are the jobs' own, and nothing runs twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, hosts_of, hosts_ok
from tests.support.remote import close, remote_config, started_cluster
from tests.support.waiting import wait_until

HOLD = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"
        "sys.exit(int(sys.argv[2]))\n")


@pytest.fixture
def rec_cluster(systemd_hosts, testhosts_root):
    config = remote_config(systemd_hosts, host_more=", unit_accounting: false").replace(
        f"cluster: rm{os.getpid()}", f"cluster: rec{os.getpid()}", 1)
    c = started_cluster(config, testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        yield c
    finally:
        close(c)


def test_jobs_ending_while_their_agents_are_killed_keep_their_exit_status_across_a_controller_restart(
    rec_cluster: Cluster, systemd_hosts
):
    c = rec_cluster
    go = c.work / "go"
    ids = [c.submit(sys.executable, "-c", HOLD, str(go), str(code)) for code in (0, 3, 0, 5)]
    wait_until(lambda: all(c.job(i)["state"] == "RUN" for i in ids), 60, "all four jobs running")
    agents = {name: h["agent"]["pid"] for name, h in hosts_of(c).items()}
    for host in systemd_hosts:
        subprocess.run(host.nsenter_argv(["kill", "-9", str(agents[host.name])]), check=True, timeout=30)
    go.touch()  # the jobs end while their agents are dead (or being started again)
    wait_until(lambda: all(c.job(i)["state"] in ("DONE", "EXIT") for i in ids), 90, "the four jobs ended")
    assert {name: h["agent"]["pid"] for name, h in hosts_of(c).items()} != agents  # new agents told them
    c.kill9_controller()
    c.start()
    hosts_ok(c, "both hosts up again")
    for job_id, code in zip(ids, (0, 3, 0, 5)):
        job = c.job(job_id)
        assert (job["state"], job["exit_code"]) == (("DONE", 0) if code == 0 else ("EXIT", code)), job
        assert job["attempt"] == 1
    # and they ran as direct units with no ExecStopPost, their ends recorded by the agents
    spools = [Path.home() / ".xce-agent" / f"rec{os.getpid()}-{h.name}" for h in systemd_hosts]
    journals = [(spool / "journal").read_text() for spool in spools]
    assert sum(j.count('"record":"agent"') for j in journals) >= len(ids)
