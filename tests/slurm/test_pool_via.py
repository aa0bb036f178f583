"""`via: LOGIN`: a pool whose Slurm commands run on a login host over SSH, not on the controller's machine.

The login host is a plain test host of this module's own (its sshd on a loopback address, its mount
namespace its own): its ~/.profile, bind-mounted there only, sets SLURM_CONF and puts wrappers of
sbatch/squeue/scancel first on the PATH, as a site's login profile would; the wrappers log each
command with the host's name. The controller's own PATH starts with wrappers that refuse and log:
the pool never uses them. The test Slurm lives outside /tmp (the host has its own /tmp), so the
login host sees its slurm.conf and munge socket; slurmctld listens on 127.0.0.1, which the host
shares.

Faults in sequence: the pool's first sbatch freezes the login host's sshd (SIGSTOP of every sshd
there, by the sbatch wrapper, just before the real sbatch): the sbatch's answer never comes back,
every squeue after it fails to connect; a local job starts and ends DONE meanwhile, and the pool
shows Slurm's trouble. The test thaws sshd: the pool recovers, finds the allocation the frozen
sbatch made by its name, and the job runs there and ends DONE. Then, while a job runs in the
allocation, the test freezes sshd again: the job goes on, local work goes on, the pool shows the
trouble and recovers after the thaw. With `connect: direct` the job ends DONE while sshd is frozen
(the node is reached over TCP); with `connect: srun` its relay runs through the login host (srun
there), so its end is reported once sshd is thawed, and it is not run again. Through it all: one
allocation, one sbatch.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.cluster import Cluster
from tests.support.remote import sshd_pids
from tests.support.slurm import WAIT_FOR, SlurmCluster, allocations, missing_prerequisites, pools
from tests.support.testhosts_fixture import require_testhosts
from tests.support.waiting import wait_until
from xce_lite import testhosts
from xce_lite.exec import slurm as slurm_cmds
from xce_lite.exec.sshtarget import SshTarget

LOCAL_JOB_DEADLINE = 25  # well within the frozen sbatch's 30 s deadline: the tick does not wait for it
COMMANDS = ("sbatch", "squeue", "scancel", "srun")


@pytest.fixture(scope="module")
def shared(testhosts_root: Path) -> Iterator[Path]:
    """A directory outside /tmp, seen alike by this machine and the test hosts."""
    d = testhosts_root / f"slurmvia-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def vslurm(shared: Path) -> Iterator[SlurmCluster]:
    problems = missing_prerequisites()
    if problems:
        pytest.fail("a test Slurm cannot run here: " + "; ".join(problems), pytrace=False)
    cluster = SlurmCluster(shared / "slurm").start()
    try:
        yield cluster
    finally:
        cluster.stop()


def login_profile(shared: Path, slurm: SlurmCluster) -> Path:
    """The login host's ~/.profile: SLURM_CONF, and wrappers first on the PATH. The sbatch wrapper
    freezes the host's sshd once (marker `froze`) before running the real sbatch."""
    bindir = shared / "login-bin"
    bindir.mkdir()
    log = shared / "login.log"
    for name in COMMANDS:
        freeze = (f'if [ ! -e {shared}/froze ]; then touch {shared}/froze; kill -STOP $(pgrep -x sshd); fi\n'
                  if name == "sbatch" else "")
        (bindir / name).write_text(f'#!/bin/sh\necho "$(hostname) {name} $*" >> {log}\n{freeze}'
                                   f'exec {shutil.which(name)} "$@"\n')
        (bindir / name).chmod(0o755)
    profile = shared / "profile"
    profile.write_text(f'export SLURM_CONF={slurm.conf}\nexport PATH="{bindir}:$PATH"\n')
    return profile


@pytest.fixture(scope="module")
def login(shared: Path, vslurm: SlurmCluster) -> Iterator[testhosts.TestHost]:
    """A plain test host `login1` whose login shells find the test Slurm (see the module docstring)."""
    require_testhosts(plain=True)
    d = shared / "hosts"
    [host] = testhosts.up(1, d, plain=True, die_with_caller=True, prefix="login")
    try:
        profile = login_profile(shared, vslurm)
        # in the host's own mount namespace only: this machine's /root/.profile stays as it is
        subprocess.run(["nsenter", "-t", str(host.pid), "-m", "mount", "--bind", str(profile), "/root/.profile"],
                       check=True, capture_output=True, text=True)
        yield host
    finally:
        for pid in sshd_pids(host):
            os.kill(pid, signal.SIGCONT)
        testhosts.down(d)


def refusing_commands(shared: Path) -> dict[str, str]:
    """The controller's PATH: Slurm's commands there refuse and log (`here.log`)."""
    bindir = shared / "controller-bin"
    bindir.mkdir(exist_ok=True)
    for name in COMMANDS:
        (bindir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {shared / "here.log"}\n'
                                   f'echo "{name}: not on this machine" >&2\nexit 1\n')
        (bindir / name).chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


def via_config(host: testhosts.TestHost, shared: Path, connect: str) -> str:
    return f"""\
        cluster: v{os.getpid()}{connect}
        hosts:
          - name: local
            slots: 1
            mem: 1G
          - {{name: {host.name}, type: ssh, address: '{host.ip}', user: root, identity: '{host.key_path}',
             slots: 1, mem: 1G}}
        queues:
          - name: normal
            default: true
            hosts: [local]
          - name: hpc
            hosts: [hpc]
        pools:
          - name: hpc
            type: slurm
            max_allocations: 1
            time_limit: 10m
            idle_timeout: 10m
            slots: 2
            mem: 512M
            python: {sys.executable}
            via: {host.name}
            connect: {connect}
            directory: {shared / 'pool'}
        ssh:
          config: /nonexistent
          known_hosts: ['{host.known_hosts_path}']
          connect_timeout: 3s
          reconnect_max: 2s
        controller:
          tick: 1s
          grace: 2s
        """


def cluster_name(c: Cluster) -> str:
    return "xce-" + yaml.safe_load((c.home / "xce.yaml").read_text())["cluster"] + "-"


def trouble(c: Cluster) -> str | None:
    return pools(c)["hpc"]["trouble"]


def commands_there(shared: Path, host: testhosts.TestHost) -> list[list[str]]:
    lines = [line.split() for line in (shared / "login.log").read_text().splitlines()]
    assert all(words[0] == host.name for words in lines), lines  # each ran on the login host
    return [words[1:] for words in lines]


@pytest.mark.parametrize("connect", ["direct", "srun"])
def test_a_pool_via_a_login_host_runs_slurm_there_and_outlives_its_frozen_sshd(login, vslurm: SlurmCluster,
                                                                               shared: Path, connect: str):
    for made in ("froze", "login.log", "here.log"):  # a fresh start for each way of connecting
        (shared / made).unlink(missing_ok=True)
    c = Cluster(config=via_config(login, shared, connect), work=shared / f"work-{connect}")
    c.env.pop("SLURM_CONF", None)
    c.env.update(refusing_commands(shared))
    c.start()
    try:
        # the pool's first sbatch freezes the login host's sshd: its answer never comes back
        go = c.work / "go"
        remote = c.submit(sys.executable, "-c", WAIT_FOR, str(go), options=("-q", "hpc"))
        wait_until(lambda: (shared / "froze").exists(), 90, "the pool's sbatch to run on the login host")
        local = c.submit("true")
        assert c.wait_state(local, {"DONE", "EXIT"}, timeout=LOCAL_JOB_DEADLINE)["state"] == "DONE"
        said = wait_until(lambda: trouble(c), 90, "the pool to show that its login host does not answer")
        assert login.name in said, said
        listing = c.ok("hosts", "-l")
        assert "Slurm in trouble" in listing and f"POOL hpc  (slurm, via {login.name}," in listing, listing
        assert c.job(remote)["state"] == "PEND"
        for pid in sshd_pids(login):
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: trouble(c) is None, 90, "the pool to recover once the login host answers")
        go.touch()
        assert c.wait_state(remote, {"DONE", "EXIT"}, timeout=120)["state"] == "DONE"
        [alloc] = allocations(c, "running")
        assert c.job(remote)["hosts"][0][0] == f"hpc-{alloc['job_id']}"

        # sshd frozen again while a job runs in the allocation: the job and local work go on (with
        # `srun`, its relay runs through the frozen login host: its end is reported after the thaw)
        go2 = c.work / "go2"
        second = c.submit(sys.executable, "-c", WAIT_FOR, str(go2), options=("-q", "hpc"))
        c.wait_state(second, {"RUN"}, timeout=60)
        for pid in sshd_pids(login):
            os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: trouble(c), 90, "the pool to show the login host's trouble again")
        local2 = c.submit("true")
        assert c.wait_state(local2, {"DONE", "EXIT"}, timeout=LOCAL_JOB_DEADLINE)["state"] == "DONE"
        go2.touch()
        if connect == "direct":
            assert c.wait_state(second, {"DONE", "EXIT"}, timeout=60)["state"] == "DONE"
        for pid in sshd_pids(login):
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: trouble(c) is None, 90, "the pool to recover after the second thaw")
        assert c.wait_state(second, {"DONE", "EXIT"}, timeout=90)["state"] == "DONE"
        assert c.job(second)["attempt"] == 1  # it ran once, in the same allocation

        # Slurm's commands ran on the login host only, the controller's machine used none of its own;
        # one sbatch, one allocation (the frozen sbatch's was found by its name, not submitted again)
        ran = commands_there(shared, login)
        assert [w[0] for w in ran].count("sbatch") == 1, ran
        assert {w[0] for w in ran} >= ({"sbatch", "squeue", "srun"} if connect == "srun" else {"sbatch", "squeue"})
        assert not (shared / "here.log").exists(), (shared / "here.log").read_text()
        names = [j["name"] for j in vslurm.jobs().values() if j["name"].startswith(cluster_name(c))]
        assert len(names) == 1, names
        assert [a["job_id"] for a in allocations(c)] == [alloc["job_id"]]
    finally:
        for pid in sshd_pids(login):
            os.kill(pid, signal.SIGCONT)
        c.close()
        vslurm.cancel_all()


def target_of(host: testhosts.TestHost, **more) -> SshTarget:
    fields = dict(name=host.name, address=host.ip, user=host.user, identity=str(host.key_path), ssh_config=None,
                  known_hosts=(str(host.known_hosts_path),))
    return SshTarget(**{**fields, **more})


def test_a_command_via_the_login_host_has_its_login_environment_and_any_amount_of_output(login, vslurm,
                                                                                        shared: Path):
    run = slurm_cmds.over_ssh(target_of(login))
    assert run(["sh", "-c", 'echo "$SLURM_CONF"; hostname'], None, 30.0).split() == [str(vslurm.conf), login.name]
    # squeue's JSON grows with the jobs: more than the gateway's 64 KB messages, streamed whole
    big = run([sys.executable, "-c", "import sys; sys.stdout.write('x' * 300_000 + 'end')"], None, 30.0)
    assert len(big) == 300_003 and big.endswith("end")
    # the real squeue there (through the wrapper on its PATH) sees what this machine's does
    assert set(slurm_cmds.squeue(via=run)) == set(vslurm.jobs())
    with pytest.raises(slurm_cmds.SlurmError, match=f"scancel on {login.name} failed: .*Invalid job id"):
        slurm_cmds.scancel("nonsense", via=run)
    with pytest.raises(slurm_cmds.SlurmError, match=f"no-such-command not found on {login.name}"):
        run(["no-such-command"], None, 30.0)


def test_an_unreachable_login_host_is_a_slurm_error_that_says_what_to_check(login):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = slurm_cmds.over_ssh(target_of(login, address="127.0.0.1", port=port))
    with pytest.raises(slurm_cmds.SlurmError, match=f"squeue on {login.name}: connection refused on 127.0.0.1:{port}") \
            as err:
        slurm_cmds.squeue(via=run)
    assert not slurm_cmds.unsure(str(err.value))  # it never reached the host: not an sbatch to look for
