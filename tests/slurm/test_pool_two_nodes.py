"""A pool whose allocations have two nodes, on a real two-node Slurm (two slurmds on this machine):
each node runs its keeper (the second started by the batch script through `srun`), each becomes a
host, a job wider than one node spans both, `xce peek` reads through the agent, and `xce launch`
starts tasks on both nodes' agents."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.slurm import SlurmCluster, missing_prerequisites, pool_config


@pytest.fixture(scope="module")
def slurm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    problems = missing_prerequisites()
    if problems:
        pytest.fail("a test Slurm cannot run here: " + "; ".join(problems), pytrace=False)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm2"), nodes=2).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_two_node_allocation_gives_two_hosts_and_a_job_spans_them(slurm2: SlurmCluster) -> None:
    c = Cluster(config=pool_config(extra="\n            nodes_per_allocation: 2"))
    c.env["SLURM_CONF"] = str(slurm2.conf)
    try:
        c.start()
        out = c.work / "wide.out"
        job = c.submit("sh", "-c", 'echo "$XCE_HOSTS|$SLURM_JOB_NODELIST|$XCE_SLOTS"',
                       options=("-q", "hpc", "-n", "4", "-o", str(out)))
        done = c.wait_state(job, {"DONE", "EXIT"}, timeout=120)
        assert done["state"] == "DONE", done
        [alloc] = [a for p in json.loads(c.ok("hosts", "-l", "--json"))["pools"] for a in p["allocations"]]
        assert alloc["nodes"] == slurm2.nodes and alloc["state"] == "running"
        hosts = [f"hpc-{alloc['job_id']}-0", f"hpc-{alloc['job_id']}-1"]
        assert alloc["hosts"] == hosts
        assert sorted(h for h, _n in done["hosts"]) == hosts
        assert out.read_text().strip().split("|")[1:] == [f"{slurm2.node}[1-2]", "4"]
        assert sorted(out.read_text().split("|")[0].split()) == hosts
        assert c.ok("peek", str(job)) == out.read_text()  # read on the job's host, through its agent

        # `xce launch` inside a job there starts its tasks on both nodes' agents
        tasks = c.work / "tasks"
        tasks.mkdir()
        task = f'echo "$XCE_JOB_HOST_DIR" > {tasks}/task-$XCE_TASK_INDEX'
        launcher = c.submit("xce", "launch", "--", "sh", "-c", task, options=("-q", "hpc", "-n", "4"))
        assert c.wait_state(launcher, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
        dirs = [(tasks / f"task-{i}").read_text() for i in range(4)]
        assert sorted(d.split("/")[-4] for d in dirs) == sorted(slurm2.nodes * 2), dirs
    finally:
        c.close()
        slurm2.cancel_all()
