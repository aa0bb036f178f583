"""The cluster configuration: `xce.yaml` in the cluster home, as pydantic models that mirror the file.

Invariants once `load_config` returns: at least one host and one queue, unique names, exactly one
default queue. A validation error names the file, the field and its line, and says what to do.
The controller imports this; the CLI's hot path (`xce submit`) does not (pydantic costs ~60 ms).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from xce_lite.config import projects as proj
from xce_lite.config.fields import NAME, WHO, Seconds, Size, StrictModel, size_value
from xce_lite.config.yamlmodel import load_yaml
from xce_lite.errors import SpecError

_SSH_ONLY = ("address", "port", "user", "identity", "python", "spool")


class HostConfig(StrictModel):
    name: str = Field(pattern=NAME)
    slots: int = Field(ge=1, le=100_000)
    mem: Size
    # `local`: the machine the controller runs on, through a local agent. `ssh`: another machine,
    # through an agent the controller copies there and runs over one SSH connection.
    type: str = Field(default="local", pattern=r"^(local|ssh)$")
    # ssh hosts only. Anything not set here comes from the SSH config file (`ssh.config`), as
    # OpenSSH would read it for this name: HostName, Port, User, IdentityFile, ProxyJump.
    address: str | None = Field(default=None, min_length=1)  # default: the name, through the SSH config
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = Field(default=None, min_length=1)
    identity: str | None = Field(default=None, min_length=1)  # a private key file
    python: str | None = Field(default=None, min_length=1)  # the host's Python 3 (default: python3)
    spool: str | None = Field(default=None, min_length=1)  # the agent's directory there (default below)
    # How jobs run there: `auto` picks systemd system units (root), systemd user units (a lingering
    # user manager), or the plain supervisor, in that order, as the host's probe allows.
    launch: str = Field(default="auto", pattern=r"^(auto|systemd|user|plain)$")
    # systemd hosts: each job's CPU time and peak memory are read by a stop command systemd runs
    # after the job (ExecStopPost). `false`: the agent records the job's end itself, without that
    # command: ~25% less host CPU per job and faster turnover, but systemd before 256 keeps no
    # CPU time or peak memory of an ended unit, so the job's record has 0 for both (hooks and
    # memory limits outside cgroup v2 keep the stop command). Plain hosts always have both.
    unit_accounting: bool = True
    gpus: int = Field(default=0, ge=0, le=1024)  # GPU count; jobs get indices in CUDA_VISIBLE_DEVICES
    # Custom numeric resources this host offers (`scratch: 100G` is a size, `fpga: 2` a count);
    # each name must be declared under the cluster's `resources:`.
    resources: dict[str, int | float | str] = Field(default_factory=dict)
    # String attributes for select[...] (`model: EPYC`), and tags (`select[avx512]`).
    attrs: dict[str, str] = Field(default_factory=dict)
    tags: list[Annotated[str, Field(pattern=NAME)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _ssh_fields_on_ssh_hosts(self) -> HostConfig:
        if self.type != "ssh":
            given = [f for f in _SSH_ONLY if getattr(self, f) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} apply to ssh hosts only; add `type: ssh` to host {self.name}")
        return self

    def agent_spool(self, cluster: str) -> str:
        """The agent's directory on an ssh host: per cluster and host, so hosts that share a home
        directory (NFS) never share a journal."""
        return self.spool or f"~/.xce-agent/{cluster}-{self.name}"


class QueueConfig(StrictModel):
    name: str = Field(pattern=NAME)
    priority: int = Field(default=30, ge=0, le=10_000)
    default: bool = False
    description: str = ""
    hosts: list[str] | None = None  # the hosts its jobs may use; None: all
    # Ceilings (LSF's RUNLIMIT, MEMLIMIT, TASKLIMIT): a job asking for more is refused at submit; a
    # job asking for nothing gets the ceiling; a task range is cut to it.
    run_limit: Seconds | None = None
    mem_limit: Size | None = None
    max_tasks: int | None = Field(default=None, ge=1)
    # Running limits, in slots (LSF's QJOB_LIMIT, UJOB_LIMIT): a job pends while they are reached.
    running_limit: int | None = Field(default=None, ge=1)
    user_running_limit: int | None = Field(default=None, ge=1)
    # Fair share (config/projects.py): decayed past usage orders the jobs of its priority level.
    fairshare: proj.FairshareConfig | None = None
    # Who may submit to it (LSF's USERS): these users, and members of these groups; neither given:
    # everyone. An admin of the cluster may always submit.
    users: list[Annotated[str, Field(pattern=WHO)]] | None = None
    groups: list[Annotated[str, Field(pattern=WHO)]] | None = None


class ControllerConfig(StrictModel):
    # How often the controller looks again when nothing woke it (a finished job or a submit does).
    tick: Seconds = 1.0
    # Between TERM and KILL when a job is killed or reaches a limit.
    grace: Seconds = 10.0
    # The scheduler examines at most this many jobs per session, then says it is not complete.
    sched_budget: int = Field(default=200_000, ge=1)
    # Starvation guard: a job that has waited this long and still cannot start reserves the
    # cluster: jobs after it in order wait until it starts. 0 turns the guard off.
    reserve_after: Seconds = 600.0
    # A host whose agent has not answered for this long is lost: its jobs are requeued (or end
    # EXIT with reason "host lost", with `on_host_lost: exit`); a copy that comes back is killed.
    host_lost_after: Seconds = 300.0
    on_host_lost: str = Field(default="requeue", pattern=r"^(requeue|exit)$")
    # Retention: finished jobs this old leave `xce jobs -a` for the archive, which `xce hist` and
    # `xce acct` still read; archived jobs this old keep only their usage per day (for `xce acct`
    # and fair share), so the store stops growing.
    keep_finished: Seconds = Field(default=30 * 86400.0, gt=0)
    keep_archived: Seconds = Field(default=365 * 86400.0, gt=0)
    # A submission's request id is remembered this long, so that a client's retry after a lost
    # reply is answered with what the first try stored (clients retry for seconds, a minute at most).
    keep_requests: Seconds = Field(default=86400.0, gt=0)
    # Prefill: a job that fits inside a running job's allocation on its host is sent there queued
    # behind it, and starts the moment it ends, without waiting for the controller (HyperQueue's
    # prefill). At most `prefill_depth` per running job; off: a freed slot waits for the next session. A queued
    # job keeps the pend reason a dispatch would give it (the resource, the limit), and `xce why`
    # and `xce jobs -l` say where it waits as well (README, "Prefill").
    prefill: bool = True
    # How deep a host's queue behind one running job may be: 8 (the default) queues jobs behind
    # queued ones too, so that a host has the next jobs in hand when one ends, and the controller,
    # woken only when a chain runs short (controller/quiet_ends.py: with a backlog, fewer than 3
    # left), refills it once per several jobs (bench/README, "wake6": ~0.36 ticks per job against
    # 0.52 at 2; "Session 14's merge": 5 against 3, one POST and array +3-16%; "Session 20": 8 with
    # the earlier refill against 5, +2-10% in two A/Bs); 1 = one job per running job.
    prefill_depth: int = Field(default=8, ge=1, le=8)

    @model_validator(mode="after")
    def _archive_outlives_live(self) -> ControllerConfig:
        if self.keep_archived < self.keep_finished:
            raise ValueError("keep_archived must be at least keep_finished (archived jobs are older)")
        return self

    # The lease each host gets (renewed while it answers): a host that has not heard from the
    # controller for this long stops its jobs itself (README "How it works"). Long enough for a
    # controller restart; `host_lost_after` must exceed it plus `lease_margin`, the time a host
    # needs to stop its jobs once it ran out (their grace, post hooks) with slack for clock rates.
    lease: Seconds = Field(default=180.0, gt=0)
    lease_margin: Seconds = Field(default=60.0, ge=0)
    # Granted to every host by a planned `xce controller stop`: how long jobs may go on without it.
    maintenance_lease: Seconds = Field(default=3600.0, gt=0)

    @model_validator(mode="after")
    def _lease_before_loss(self) -> ControllerConfig:
        if self.host_lost_after <= self.lease + self.lease_margin:
            raise ValueError(
                f"host_lost_after ({self.host_lost_after:g}s) must be greater than lease ({self.lease:g}s) "
                f"+ lease_margin ({self.lease_margin:g}s): "
                "a host out of reach stops its jobs when its lease runs out, and its jobs may run "
                "elsewhere only after that; raise host_lost_after or lower lease")
        return self


class SshConfig(StrictModel):
    """How the controller reaches ssh hosts (all hosts share these)."""

    # OpenSSH client config to read per host (HostName, Port, User, IdentityFile, ProxyJump).
    config: str = "~/.ssh/config"
    # Host keys are checked against these and <home>/known_hosts (where `xce hosts add --accept-new`
    # writes); an unknown key is refused, never accepted silently.
    known_hosts: list[str] = Field(default_factory=lambda: ["~/.ssh/known_hosts"])
    connect_timeout: Seconds = 10.0
    keepalive: Seconds = 15.0  # seconds between keepalives on an idle connection
    reconnect_max: Seconds = 60.0  # the longest wait between two reconnect attempts (backoff)


BUILTIN_RESOURCES = ("slots", "mem", "gpus")


class ResourceConfig(StrictModel):
    """A custom numeric resource: `size` amounts take K/M/G/T (stored in bytes), `count` ones don't."""

    kind: str = Field(default="count", pattern=r"^(count|size)$")
    description: str = ""


# Host pools: hosts that come and go with allocations of an outside batch system (Slurm). A pool's
# temporary hosts (one per allocated node) are named POOL-JOBID (POOL-JOBID-N with several nodes per
# allocation); each offers `slots` and `mem`, which is what an allocation asks Slurm for per node.
# A queue's `hosts:` may name a pool, meaning all its temporary hosts (controller/pools.py).
class PoolConfig(StrictModel):
    name: str = Field(pattern=NAME)
    type: str = Field(pattern=r"^slurm$")
    partition: str | None = Field(default=None, min_length=1)  # sbatch --partition; None: Slurm's default
    account: str | None = Field(default=None, min_length=1)  # sbatch --account
    max_allocations: int = Field(default=1, ge=1, le=1000)  # allocations at once, pending ones included
    nodes_per_allocation: int = Field(default=1, ge=1, le=1000)
    time_limit: Seconds = Field(default=3600.0, gt=0)  # sbatch --time, per allocation
    idle_timeout: Seconds = Field(default=300.0, ge=0)  # an allocation with no job this long is released
    sbatch_args: list[str] = Field(default_factory=list)  # more sbatch options, as given
    # Where Slurm's commands run: `local` (this machine is a login node of the cluster), or the name
    # of an ssh host of `hosts:` (a login node: sbatch, squeue and scancel run there over SSH, in a
    # login shell; with `connect: srun` the relays run there too).
    via: str = Field(default="local", min_length=1)
    # How the controller reaches an allocation's agent: `srun` (a relay step, `srun --overlap`: works
    # wherever srun does) or `direct` (a TCP connection to the node, ~40 ms less per launch of more
    # than ~1 KB; the nodes' ports must be reachable from this machine).
    connect: str = Field(default="srun", pattern=r"^(srun|direct)$")
    slots: int = Field(default=1, ge=1, le=100_000)  # per node: sbatch --cpus-per-task
    mem: Size = Field(default=1024**3)  # per node: sbatch --mem
    python: str = Field(default="python3", min_length=1)  # the nodes' Python 3
    # Where allocations keep their files (the agent, its spools, logs): a directory the nodes share
    # with this machine. Default: the controller's home, <home>/slurm/<pool>.
    directory: str | None = Field(default=None, min_length=1)
    attrs: dict[str, str] = Field(default_factory=dict)
    tags: list[Annotated[str, Field(pattern=NAME)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _type_attr(self) -> PoolConfig:
        if "type" in self.attrs:
            raise ValueError(f"pool {self.name}: attrs.type is set by xce (slurm); choose another name")
        return self

    def sbatch_options(self, job_name: str) -> list[str]:
        """The options xce gives sbatch for one allocation, before `sbatch_args`."""
        opts = [f"--job-name={job_name}", f"--nodes={self.nodes_per_allocation}", "--ntasks-per-node=1",
                f"--cpus-per-task={self.slots}", f"--mem={max(1, self.mem // 1024**2)}M",
                f"--time={max(1, int(self.time_limit + 59) // 60)}"]
        if self.partition:
            opts.append(f"--partition={self.partition}")
        if self.account:
            opts.append(f"--account={self.account}")
        return opts + list(self.sbatch_args)


class ClusterConfig(StrictModel):
    cluster: str = Field(pattern=NAME)
    # personal: one user's cluster (jobs run as the controller's user). shared: a lab's one controller,
    # run as root; each job runs as its submitter, who acts on their own jobs only (README "A shared lab").
    mode: str = Field(default="personal", pattern=r"^(personal|shared)$")
    # Shared mode: who may act on every job, change the configuration and stop the controller:
    # user names, and groups as "@group". root always may.
    admins: list[Annotated[str, Field(pattern=r"^@?" + WHO[1:])]] = Field(default_factory=list)
    # Shared mode: the socket is open to this group only (0660); none: to every local user (0666).
    socket_group: str | None = Field(default=None, pattern=WHO)
    # What a user sees of others' jobs: full, or summary (no command line, environment, cwd, output paths).
    visibility: str = Field(default="full", pattern=r"^(full|summary)$")
    hosts: list[HostConfig] = Field(min_length=1)
    queues: list[QueueConfig] = Field(min_length=1)
    pools: list[PoolConfig] = Field(default_factory=list)
    controller: ControllerConfig = ControllerConfig()
    ssh: SshConfig = SshConfig()
    # Custom numeric resources hosts may offer (declared once, so a typo on a host is an error).
    resources: dict[Annotated[str, Field(pattern=NAME)], ResourceConfig] = Field(default_factory=dict)
    # Cluster-wide counters such as licenses (`lic_matlab: 4`): a job's `/job` rusage takes from them.
    shared: dict[Annotated[str, Field(pattern=NAME)], Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    # The application profile (applications.yaml beside this file) of jobs submitted without -app;
    # "" for none. It must name a profile (`default` is built in), or the config is refused.
    default_application: str = Field(default="default", pattern=r"^$|" + NAME)
    # Projects (config/projects.py): none defined is open mode (any project name, no limits).
    projects: list[proj.ProjectConfig] = Field(default_factory=list)
    groups: dict[Annotated[str, Field(pattern=NAME)], proj.GroupConfig] = Field(default_factory=dict)
    default_project: str | None = Field(default=None, pattern="^" + proj.PROJECT_RE.pattern + "$")

    @field_validator("resources")
    @classmethod
    def _not_builtin(cls, resources: dict) -> dict:
        clash = sorted(set(resources) & set(BUILTIN_RESOURCES))
        if clash:
            raise ValueError(f"{', '.join(clash)} is built in; declare only your own resources here")
        return resources

    @model_validator(mode="after")
    def _host_resources_declared(self) -> ClusterConfig:
        for host in self.hosts:
            unknown = sorted(set(host.resources) - set(self.resources))
            if unknown:
                raise ValueError(f"host {host.name} offers undeclared resource(s) {', '.join(unknown)}; "
                                 f"declare them under `resources:` (kind: count or size)")
            for name, amount in host.resources.items():
                self.resource_amount(name, amount, f"host {host.name}")
        hosts = {h.name for h in self.hosts}
        clash = sorted(hosts & {p.name for p in self.pools})
        if clash:
            raise ValueError(f"{', '.join(clash)} names both a host and a pool; rename one")
        for pool in self.pools:
            via = next((h for h in self.hosts if h.name == pool.via), None)
            if pool.via != "local" and (via is None or via.type != "ssh"):
                raise ValueError(f"pool {pool.name}: via: {pool.via} is not an ssh host of `hosts:`; name the "
                                 "login host there (type: ssh, its address, user, identity), or use via: local")
        hosts |= {p.name for p in self.pools}
        for queue in self.queues:
            unknown = sorted(set(queue.hosts or ()) - hosts)
            if unknown:
                raise ValueError(f"queue {queue.name} names unknown host(s) {', '.join(unknown)}")
        clash = sorted(set(self.shared) & (set(self.resources) | set(BUILTIN_RESOURCES)))
        if clash:
            raise ValueError(f"{', '.join(clash)} cannot be both a shared counter and a host resource")
        proj.check(self.projects, self.groups, self.default_project, self.limit_amount)
        return self

    @model_validator(mode="after")
    def _shared_keys_in_shared_mode(self) -> ClusterConfig:
        given = [key for key in ("admins", "socket_group") if getattr(self, key)]
        if self.mode != "shared" and given:
            raise ValueError(f"{' and '.join(given)} apply to a shared home only; add `mode: shared` "
                             f"(the controller then runs as root), or remove them")
        if self.socket_group is not None:
            import grp

            try:
                grp.getgrnam(self.socket_group)
            except KeyError:
                raise ValueError(f"socket_group {self.socket_group!r} is no group of this machine; "
                                 f"create it (groupadd) or name another") from None
        return self

    def limit_amount(self, resource: str, amount: int | float | str, where: str) -> float:
        """A project limit in base units (a bare number of `mem` is megabytes, as on hosts)."""
        if resource == "mem":
            return float(size_value(amount))
        if resource in self.resources:
            return self.resource_amount(resource, amount, where)
        if resource in ("slots", "gpus", "jobs") or resource in self.shared:
            if isinstance(amount, (str, bool)) or amount < 0:
                raise ValueError(f"{where}: {resource} is a count: give a number of 0 or more, not {amount!r}")
            return float(amount)
        known = ", ".join(["slots", "mem", "gpus", "jobs", *sorted(self.resources), *sorted(self.shared)])
        raise ValueError(f"{where}: {resource!r} is not a resource of this cluster; limits take: {known}")

    def project_view(self):
        """The scheduler's view of the projects (sched/projects.Projects)."""
        return proj.to_projects(self.projects, self.groups, self.default_project, self.limit_amount)

    def resource_amount(self, name: str, amount: int | float | str, where: str) -> float:
        """A host's amount of a custom resource in base units (bytes for sizes)."""
        kind = self.resources[name].kind
        if kind == "size":
            return float(size_value(amount))
        if isinstance(amount, (str, bool)) or amount < 0:
            raise ValueError(f"{where}: {name} is a count: give a number of 0 or more, not {amount!r}")
        return float(amount)

    @field_validator("projects")
    @classmethod
    def _project_tree(cls, projects: list) -> list:
        proj.check_tree(projects)
        return projects

    @field_validator("hosts", "queues", "pools")
    @classmethod
    def _unique_names(cls, items: list) -> list:
        names = [item.name for item in items]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"names must be unique; repeated: {', '.join(dupes)}")
        return items

    @field_validator("queues")
    @classmethod
    def _one_default(cls, queues: list[QueueConfig]) -> list[QueueConfig]:
        defaults = [q.name for q in queues if q.default]
        if len(defaults) > 1:
            raise ValueError(f"only one queue may say `default: true`; these do: {', '.join(defaults)}")
        return queues

    @property
    def default_queue(self) -> QueueConfig:
        return next((q for q in self.queues if q.default), self.queues[0])

    def queue(self, name: str | None) -> QueueConfig:
        """The queue named, or the default one for None; SpecError lists the known names."""
        if name is None:
            return self.default_queue
        for q in self.queues:
            if q.name == name:
                return q
        known = ", ".join(q.name for q in self.queues)
        raise SpecError(f"unknown queue {name!r}; the queues are: {known} (see `xce queues`)")


def load_config(path: Path) -> ClusterConfig:
    """Read and validate `path`; ConfigError names the file, the field, the line and the fix."""
    return load_yaml(path, ClusterConfig, "create it with `xce init`",
                     "a mapping with `cluster`, `hosts` and `queues`")[0]
