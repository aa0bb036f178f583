"""A real Slurm cluster on loopback (one node, or several on this one machine), for tests and benchmarks.

`SlurmCluster(directory).start()` writes a munge key and a slurm.conf into `directory` and starts
munged (on a private socket, with that key), slurmctld and slurmd (one per node: `nodes=2` runs two
slurmds on this machine, NODE1 and NODE2), each a child process of this one (in the foreground,
`-F`/`-D`), on ports of their own on 127.0.0.1; `stop()` cancels every job left, waits for them to
end, then stops the daemons by the PIDs it started, never by name.
Everything the cluster writes (state, spool, logs, pid files) stays in `directory`, so several
clusters (several engineers' sessions) can run on one machine at once.

The daemons die with the process that started them (PR_SET_PDEATHSIG), so a killed pytest leaves
no Slurm behind. Slurm's commands find this cluster through `SLURM_CONF` (`cluster.env`).

Facts this rests on (Debian 12, slurm-wlm 22.05): without systemd or cgroups a node runs with
`proctrack/linuxproc` and `task/none`; `SlurmdParameters=config_overrides` lets the node declare
more CPUs than the machine has (several allocations share this one node); munged runs as root only
with `--force`.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.waiting import wait_until

BINARIES = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "sbatch", "squeue", "scancel", "srun")
PR_SET_PDEATHSIG = 1


def missing_prerequisites() -> list[str]:
    """What this machine lacks to run a test cluster, each with its remedy; [] when it can."""
    problems = []
    if os.geteuid() != 0:
        problems.append("slurmd must run as root")
    for b in BINARIES:
        if (b.startswith("/") and not os.access(b, os.X_OK)) or (not b.startswith("/") and not shutil.which(b)):
            problems.append(f"{b} missing (run tests/install_test_deps.sh)")
    return problems


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen


class SlurmCluster:
    """One slurmctld and one slurmd (node `node`, the machine's short host name, as slurmd wants)
    with `cpus` CPUs, partition `partition`. See the module docstring."""

    def __init__(self, directory: str | os.PathLike, cpus: int = 8, partition: str = "debug", nodes: int = 1) -> None:
        self.dir = Path(directory).absolute()
        self.cpus, self.partition = cpus, partition
        self.node = socket.gethostname().split(".")[0]
        # Several nodes: slurmds named NODE1, NODE2, ... on this machine, each on a port of its own
        # (a Slurm built with --enable-multiple-slurmd, as Debian's is).
        self.nodes = [self.node] if nodes == 1 else [f"{self.node}{i}" for i in range(1, nodes + 1)]
        self.conf = self.dir / "slurm.conf"
        self.daemons: list[Daemon] = []

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF naming this cluster's configuration."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        d = self.dir
        for sub in ("state", "slurmd"):  # a cluster of an earlier start in this directory: a fresh one
            shutil.rmtree(d / sub, ignore_errors=True)
        for sub in ("state", "slurmd", "munge"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d / "munge", 0o700)
        key = d / "munge" / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
        self.munge_socket = d / "munge" / "munge.sock"
        name = f"xce{os.getpid()}"
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName={name}",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    *([f"SlurmdPort={_free_port()}"] if len(self.nodes) == 1 else []),
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={d / 'state'}",
                    f"SlurmdSpoolDir={d / 'slurmd' / '%n'}",
                    f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                    f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={d / 'slurmctld.log'}",
                    f"SlurmdLogFile={d / 'slurmd-%n.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "JobCompType=jobcomp/filetxt",
                    f"JobCompLoc={d / 'jobcomp.txt'}",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SchedulerType=sched/backfill",
                    "SlurmdParameters=config_overrides",
                    "InactiveLimit=0",
                    "KillWait=5",
                    "MinJobAge=300",
                    *self._node_lines(),
                    f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE "
                    "State=UP",
                    "",
                ]
            )
        )

    def _node_lines(self) -> list[str]:
        if len(self.nodes) == 1:
            return [f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 State=UNKNOWN"]
        return [f"NodeName={n} NodeHostname={self.node} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={self.cpus} "
                f"RealMemory=4000 State=UNKNOWN" for n in self.nodes]

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.out", "ab")
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                preexec_fn=_die_with_parent, close_fds=True,
            )
        finally:
            log.close()
        self.daemons.append(Daemon(name, proc))

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        """Start munged, slurmctld and slurmd; return once the node takes jobs."""
        self._write_config()
        d = self.dir
        self._spawn("munged", ["/usr/sbin/munged", "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={d / 'munge' / 'munge.key'}", f"--pid-file={d / 'munge' / 'munged.pid'}",
                               f"--log-file={d / 'munge' / 'munged.log'}", f"--seed-file={d / 'munge' / 'seed'}"])
        wait_until(lambda: self.munge_socket.exists() or self._dead(), 20, "munged's socket")
        self._check_alive()
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            (d / "slurmd" / node).mkdir(parents=True, exist_ok=True)
            self._spawn(f"slurmd-{node}", ["/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf)])
        try:
            wait_until(lambda: self._dead() or all(self.node_state(n) in ("idle", "mixed", "allocated")
                                                   for n in self.nodes), timeout,
                       f"the nodes {', '.join(self.nodes)} of the test Slurm to be up")
            self._check_alive()
        except BaseException:
            self.stop()
            raise
        return self

    def ctld(self) -> subprocess.Popen:
        """The slurmctld this cluster started (for a test that freezes, kills or restarts it)."""
        return next(d.proc for d in self.daemons if d.name == "slurmctld")

    def save_state(self, job_id: str, timeout: float = 30.0) -> None:
        """Until slurmctld has saved its jobs' state with job `job_id` as it is now. Observed: it
        saves ~1 s after a change; one killed -9 before that recovers a running job as PENDING and
        runs its batch script again (a fault of its own, tested apart). A save later than the job's
        start time is not proof: Slurm's times are whole seconds, and a save of the same second may
        precede the start. So the job is changed now (its comment), and a save after that awaited."""
        path = self.dir / "state" / "job_state"
        asked = time.time()
        self.run("scontrol", "update", f"JobId={job_id}", f"Comment=saved-{asked:.3f}")
        wait_until(lambda: path.exists() and path.stat().st_mtime > asked, timeout, "slurmctld to save its state")

    def kill_ctld(self) -> None:
        """kill -9 of slurmctld (by its PID); the nodes and their jobs go on without it."""
        proc = self.ctld()
        proc.kill()
        proc.wait()

    def restart_ctld(self, timeout: float = 60.0) -> None:
        """Start slurmctld again on its saved state (the jobs it knew are recovered), once it answers."""
        self.daemons = [d for d in self.daemons if d.name != "slurmctld"]
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        wait_until(lambda: self._dead() or self.run("squeue", "-h", check=False).returncode == 0, timeout,
                   "the restarted slurmctld to answer")
        self._check_alive()

    def _dead(self) -> str | None:
        return next((d.name for d in self.daemons if d.proc.poll() is not None), None)

    def _check_alive(self) -> None:
        dead = self._dead()
        if dead:
            out = (self.dir / f"{dead}.out").read_text(errors="replace")[-3000:]
            self.stop()
            raise RuntimeError(f"test Slurm: {dead} exited; its output:\n{out}")

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster; its completed process (text)."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def node_state(self, node: str | None = None) -> str:
        r = self.run("sinfo", "-h", "-N", "-o", "%T", "-n", node or self.node, check=False)
        return r.stdout.strip().rstrip("*~#") if r.returncode == 0 else ""

    def sbatch(self, *args: str) -> str:
        """Submit with `sbatch --parsable ARGS`; the job id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def jobs(self) -> dict[str, dict]:
        """Job id -> squeue's JSON record, for the jobs slurmctld still knows."""
        r = self.run("squeue", "--json")
        return {str(j["job_id"]): j for j in json.loads(r.stdout)["jobs"]}

    def job_state(self, job_id: str) -> str | None:
        j = self.jobs().get(str(job_id))
        return j["job_state"] if j else None

    def cancel_all(self, timeout: float = 60.0) -> None:
        """scancel every job of the partition and wait until none runs (between tests)."""
        self.run("scancel", "--partition", self.partition, check=False)
        wait_until(lambda: all(j["job_state"] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING")
                               for j in self.jobs().values()), timeout, "every Slurm job to end")

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel every job, wait for them to end, then stop the daemons by PID (newest first)."""
        if self.daemons and not self._dead():
            try:
                self.run("scancel", "--full", "--partition", self.partition, check=False)
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    states = set(self.run("squeue", "-h", "-o", "%T", check=False).stdout.split())
                    if not states - {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL"}:
                        break
                    time.sleep(0.2)
            except subprocess.TimeoutExpired:
                pass
        for d in reversed(self.daemons):
            if d.proc.poll() is None:
                d.proc.terminate()
                try:
                    d.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    d.proc.kill()
                    d.proc.wait()
        self.daemons.clear()


NAMES = itertools.count(1)


def pool_config(time_limit: str = "5m", idle_timeout: str = "5m", extra: str = "") -> str:
    # a cluster name of its own per test: Slurm remembers the allocations of earlier tests by name
    return f"""\
        cluster: s{os.getpid()}n{next(NAMES)}
        hosts:
          - name: local
            slots: 1
            mem: 1G
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
            time_limit: {time_limit}
            idle_timeout: {idle_timeout}
            slots: 2
            mem: 512M
            python: {sys.executable}{extra}
        controller:
          tick: 1s
          grace: 2s
        """


def pools(c) -> dict:
    """The pools as `xce hosts -l --json` shows them, by name (c: a tests.support.cluster.Cluster)."""
    return {p["name"]: p for p in json.loads(c.ok("hosts", "-l", "--json"))["pools"]}


def allocations(c, state: str | None = None) -> list[dict]:
    """The allocations of pool hpc (pool_config's), those in `state` if given."""
    return [a for a in pools(c)["hpc"]["allocations"] if state is None or a["state"] == state]


# a job that waits for the file argv[1] (at most 120 s), then exits 0
WAIT_FOR = (
    "import os, sys, time\n"
    "end = time.time() + 120\n"
    "while not os.path.exists(sys.argv[1]) and time.time() < end:\n"
    "    time.sleep(0.05)\n"
    "sys.exit(0 if os.path.exists(sys.argv[1]) else 3)\n"
)
