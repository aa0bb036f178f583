"""Slurm's commands, for a pool of allocations: sbatch, squeue, scancel, and the batch script.

The commands run with the controller's environment, so `SLURM_CONF` and the user's Slurm defaults
(SBATCH_* variables) hold as they do for `sbatch` by hand; or, for a pool with `via: HOST`, on that
login host over SSH (`over_ssh`: through the SSH gateway, in a login shell there, so that host's
profile sets them). Every call has a deadline (a hung slurmctld or login host must not hang the
controller) and a failure raises SlurmError with Slurm's own words (or SSH's).

An allocation's batch script (`batch_script`) execs the agent's `keep` command in the batch step
(exec/agent/keeper.py): there, no `srun` client of the controller's carries it, so a controller
crash cannot take it down. Its files live in DIR/<job id>/<node>/ on a file system the nodes share
with the controller (the home directory, on most sites): the keeper's socket, the spool, the log.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from xce_lite.errors import ExecError, XceError
from xce_lite.exec.sshtarget import SshTarget

TIMEOUT = 30.0  # seconds a Slurm command may take
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY")


class SlurmError(ExecError):
    """A Slurm command failed or could not run; the message has Slurm's words. A retry may help
    (slurmctld busy or restarting) or not (a rejected sbatch: fix the pool's settings)."""


@dataclass(frozen=True)
class SlurmJob:
    """What squeue says of one allocation. `state` is Slurm's (PENDING, RUNNING, COMPLETING, ...);
    `reason` Slurm's reason for a pending one ("Resources", "Priority", "QOSMaxJobsPerUserLimit");
    `nodes` the allocated nodes, in order; times are epoch seconds (`end_time`: the time limit's
    end while it runs), `time_limit` seconds or None for no limit."""

    job_id: str
    state: str
    reason: str
    nodes: tuple[str, ...]
    start_time: float | None
    end_time: float | None
    time_limit: float | None
    name: str = ""
    nodelist: str = ""  # the nodes as Slurm writes them (node[01-04]): SLURM_JOB_NODELIST

    @property
    def ended(self) -> bool:
        return self.state in ENDED


# Where a command runs: (argv, stdin, timeout) -> its stdout; SlurmError when it cannot run or fails.
Runner = Callable[[list[str], "str | None", float], str]
NOT_FOUND = 127  # a login shell's exit status for a command not on its PATH


def run(argv: list[str], timeout: float = TIMEOUT, stdin: str | None = None, via: Runner | None = None) -> str:
    """Run one Slurm command (here, or through `via`); its stdout. SlurmError when it cannot run,
    times out or fails."""
    if via is not None:
        return via(argv, stdin, timeout)
    try:
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: install Slurm's client commands on the controller's machine, "
                         "or put them on the controller's PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:g} s; is slurmctld up (`scontrol ping`)?") from None
    return _outcome(argv, r.returncode, r.stdout, r.stderr)


def _outcome(argv: list[str], status: int, stdout: str, stderr: str, where: str = "") -> str:
    if status != 0:
        words = " ".join(stderr.split()) or f"exit status {status}"
        raise SlurmError(f"{argv[0]}{where} failed: {words}")
    return stdout


def login_command(argv: list[str]) -> str:
    """A remote command line that runs `argv` in a login shell of the user's (bash, zsh, ksh or sh;
    another shell: /bin/sh), so the host's /etc/profile and ~/.profile set SLURM_CONF, PATH and the
    SBATCH_* defaults, as for `sbatch` typed there. Every word is quoted: config values only."""
    words = " ".join(shlex.quote(w) for w in argv)
    script = ('case "${SHELL##*/}" in bash|zsh|ksh|mksh|dash|sh) s=$SHELL;; *) s=/bin/sh;; esac; '
              f"exec \"$s\" -l -c 'exec \"$0\" \"$@\"' {words}")
    return "exec /bin/sh -c " + shlex.quote(script)


def over_ssh(target: SshTarget) -> Runner:
    """A Runner for Slurm's commands on the login host `target`, through the SSH gateway (sshgate.py:
    paramiko stays out of this process). A host that cannot be reached, or a command that outlives
    its deadline, is a SlurmError that says so: the pool is in trouble, as with a dead slurmctld."""
    from xce_lite.exec.sshgate import run_command

    def run_there(argv: list[str], stdin: str | None, timeout: float) -> str:
        where = f" on {target.name}"
        try:
            status, out, err = run_command(target, login_command(argv), stdin, timeout)
        except XceError as exc:
            if "did not end within" in str(exc) or "while starting the command" in str(exc):
                # it may have reached slurmctld all the same: unsure() must say so
                raise SlurmError(f"{argv[0]}{where} did not answer within {timeout:g} s: {exc}") from None
            raise SlurmError(f"{argv[0]}{where}: {exc}") from None
        if status == NOT_FOUND and not out:
            raise SlurmError(f"{argv[0]} not found on {target.name} ({' '.join(err.split()) or 'not on the PATH'}); "
                             f"install Slurm's client commands there, or set PATH in its ~/.profile")
        return _outcome(argv, status, out, err, where)

    return run_there


def unsure(message: str) -> bool:
    """Whether a failed command's words leave open that slurmctld got the request all the same: it
    timed out after sending (slurmctld frozen or slow), rather than being refused or unreachable."""
    return "did not answer within" in message or "timed out" in message.lower()


def sbatch(script: str, args: list[str], via: Runner | None = None) -> str:
    """Submit `script` (its text, on sbatch's stdin) with `sbatch --parsable ARGS`; the job id."""
    out = run(["sbatch", "--parsable", *args], stdin=script, via=via).strip()
    job_id = out.split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed {out!r}, not a job id")
    return job_id


def scancel(job_id: str, via: Runner | None = None) -> None:
    run(["scancel", str(job_id)], via=via)


def _epoch(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def parse_squeue(text: str) -> dict[str, SlurmJob]:
    """`squeue --json`'s jobs by id (Slurm 22.05's shape). SlurmError when squeue says it failed:
    observed, with slurmctld gone it exits 0 with no jobs and an `errors` list, which read as
    "every allocation ended" would requeue every job running in one."""
    try:
        reply = json.loads(text)
    except ValueError:
        raise SlurmError(f"squeue printed no JSON: {text[:200]!r}") from None
    errors = reply.get("errors") or []
    if errors:
        words = "; ".join(f"{e.get('source', 'squeue')}: {e.get('description') or e.get('error')}" for e in errors)
        raise SlurmError(f"squeue failed: {words}; is slurmctld up (`scontrol ping`)?")
    jobs = {}
    for j in reply.get("jobs", []):
        res = j.get("job_resources") or {}
        nodes = tuple(n["nodename"] for n in res.get("allocated_nodes", []) if "nodename" in n)
        limit = j.get("time_limit")
        jobs[str(j["job_id"])] = SlurmJob(
            job_id=str(j["job_id"]),
            state=str(j.get("job_state", "UNKNOWN")),
            reason=str(j.get("state_reason", "") or ""),
            nodes=nodes,
            start_time=_epoch(j.get("start_time")),
            end_time=_epoch(j.get("end_time")),
            time_limit=float(limit) * 60 if isinstance(limit, int) else None,
            name=str(j.get("name", "")),
            nodelist=str(j.get("nodes", "") or ""),
        )
    return jobs


def squeue(job_ids: list[str] | None = None, via: Runner | None = None) -> dict[str, SlurmJob]:
    """The state of these jobs (None: every job of this user). A job slurmctld no longer knows is
    absent: it ended long enough ago (MinJobAge)."""
    if job_ids is not None and not job_ids:
        return {}
    jobs = parse_squeue(run(["squeue", "--json", "--me"], via=via))
    return jobs if job_ids is None else {k: v for k, v in jobs.items() if k in set(job_ids)}


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def batch_script(pool: str, directory: str, python: str, agent_file: str, nodes: int, tcp: bool = False) -> str:
    """The batch script of an allocation of pool `pool`: every node runs `keep` (exec/agent/keeper.py)
    in DIRECTORY/$SLURM_JOB_ID/$SLURMD_NODENAME; the first node in the batch step itself, the others
    in one step started from it (its `srun` client lives in the batch step, out of the controller's
    reach). Host names are POOL-JOBID (one node) or POOL-JOBID-NODEINDEX. `tcp`: the keepers listen
    on TCP too, for a controller that connects straight (keeper.py)."""
    d, py, agent = shell_quote(directory), shell_quote(python), shell_quote(agent_file)
    suffix = '-"$SLURM_NODEID"' if nodes > 1 else ""
    keep = (f'{py} -S -E {agent} keep --dir "$d/$SLURMD_NODENAME" --spool "$d/$SLURMD_NODENAME/spool" '
            f'--host-name {shell_quote(pool)}-"$SLURM_JOB_ID"{suffix}' + (" --tcp 1" if tcp else ""))
    lines = [
        "#!/bin/sh",
        f"# xce_lite: an allocation of pool {pool}; each node runs the xce agent's keeper (README:",
        '# "Running on a Slurm cluster"). Written by the controller; do not edit.',
        f'd={d}/"$SLURM_JOB_ID"',
        'mkdir -p "$d/$SLURMD_NODENAME" || exit 1',
    ]
    if nodes > 1:
        inner = 'd=$0; mkdir -p "$d/$SLURMD_NODENAME" && exec ' + keep
        lines.append(
            f'srun --overlap --relative=1 --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks-per-node=1 sh -c '
            f'{shell_quote(inner)} "$d" &'
        )
    lines += [f"exec {keep}", ""]
    return "\n".join(lines)


def relay_argv(job_id: str, node: str, directory: str, python: str, agent_file: str) -> list[str]:
    """The relay to the agent of `node` of allocation `job_id`, through a step of its own that
    shares the allocation's resources (`srun --overlap`): killing it harms no job."""
    return [
        "srun", "--overlap", f"--jobid={job_id}", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
        "--unbuffered", "--quiet", "--job-name=xce-relay",
        python, "-S", "-E", agent_file, "relay", "--dir", os.path.join(directory, job_id, node),
    ]
