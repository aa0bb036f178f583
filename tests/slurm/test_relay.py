"""The agent inside a real Slurm allocation: started by the batch script's keeper, reached through a
relay (`srun --overlap`, or a TCP connection to the keeper) that can be killed, as a controller
crash would, without harm to the jobs; a TCP client without the keeper's token is turned away."""

from __future__ import annotations

import os
import queue
import signal
import socket
import sys

import pytest

from tests.support.agent_local import WAIT_JOB
from tests.support.slurm import SlurmCluster
from tests.support.waiting import wait_until
from xce_lite.errors import HostUnreachable
from xce_lite.exec import bundle, slurm
from xce_lite.exec.host import HostLost, LaunchRequest, UnitFinished
from xce_lite.exec.slurmhost import SlurmHost


@pytest.fixture(params=[False, True], ids=["srun", "tcp"])
def allocation(slurm: SlurmCluster, tmp_path, monkeypatch, request):
    """A running allocation of pool `p` whose node runs the keeper (listening on TCP too in the
    `tcp` case): (job id, pool dir, agent file, tcp)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    pool_dir = tmp_path / "pool"
    agent = bundle.install(pool_dir)
    script = slurm_mod.batch_script("p", str(pool_dir), sys.executable, str(agent), 1, tcp=request.param)
    job = slurm_mod.sbatch(script, ["--job-name=xce-p", f"--output={pool_dir}/slurm-%j.out", "--time=10"])
    wait_until(lambda: slurm_mod.squeue([job]).get(job) and slurm_mod.squeue([job])[job].state == "RUNNING",
               60, f"allocation {job} to run")
    yield job, pool_dir, agent, request.param
    slurm.run("scancel", job, check=False)
    wait_until(lambda: not slurm_mod.squeue([job]) or slurm_mod.squeue([job])[job].ended, 60, f"{job} to end")


slurm_mod = slurm


def waiter(tmp_path, unit: str) -> LaunchRequest:
    return LaunchRequest(unit=unit, argv=(sys.executable, "-c", WAIT_JOB, str(tmp_path / f"go-{unit}"), "0"),
                         env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path), stdout=str(tmp_path / f"{unit}.out"),
                         stderr=None)


def test_job_outlives_a_killed_relay_and_is_adopted(slurm: SlurmCluster, allocation, tmp_path) -> None:
    job, pool_dir, agent, tcp = allocation
    [info] = slurm_mod.squeue([job]).values()
    assert info.nodes == (slurm.node,) and info.time_limit == 600
    host = SlurmHost(f"p-{job}", job, slurm.node, pool_dir, agent, direct=tcp)
    events: queue.Queue = queue.Queue()
    probe = wait_until(lambda: _connected(host, events), 30, "the keeper to answer")
    assert probe.extra["mode"] == "plain" and probe.extra["spool"] == str(pool_dir / job / slurm.node / "spool")
    first_agent = probe.extra["pid"]
    [reply] = host.launch([waiter(tmp_path, "u1")])
    assert reply.status == "started"
    if tcp:  # a client without the token is turned away, and the agent serving goes on
        host_name, port, _token = (pool_dir / job / slurm.node / "k.tcp").read_text().split()
        with socket.create_connection((host_name, int(port))) as intruder:
            intruder.sendall(b"0" * 32 + b"\n")
            assert intruder.recv(100) == b""
        assert host.ping() > 0

    # A controller crash: its srun client dies at once (Slurm ends that step), or its TCP
    # connection closes; the agent in the batch step reads EOF and exits. The job goes on.
    if tcp:
        host._sock.shutdown(socket.SHUT_RDWR)
    else:
        os.kill(host.agent_pid, signal.SIGKILL)
    wait_until(lambda: isinstance(_next(events), HostLost), 30, "the relay's loss")
    host.close()
    wait_until(lambda: not os.path.exists(f"/proc/{first_agent}"), 30, f"the first agent ({first_agent}) to exit")
    assert slurm_mod.squeue([job])[job].state == "RUNNING"

    # A new relay (twice: the second connection replaces the first) finds the job still running.
    again = SlurmHost(f"p-{job}", job, slurm.node, pool_dir, agent, direct=tcp)
    again.connect(queue.Queue())
    events2: queue.Queue = queue.Queue()
    try:
        again.connect(events2)
        [unit] = again.list_units()
        assert unit.unit == "u1" and unit.status == "running"
        (tmp_path / "go-u1").touch()
        finished = wait_until(lambda: _next(events2), 30, "u1's end")
        assert isinstance(finished, UnitFinished) and finished.unit == "u1" and finished.result.exit_code == 0
    finally:
        again.close()


def _connected(host: SlurmHost, events: queue.Queue):
    try:
        return host.connect(events)
    except HostUnreachable:
        return None  # the keeper is not up yet (direct connections do not wait for it)


def _next(events: queue.Queue):
    try:
        return events.get(timeout=0.5)
    except queue.Empty:
        return None
