"""What the controller's parts share in memory: one typed object, built by the Controller and given
to each part that reads or changes it (a part never holds the Controller).

Invariants: the tick's thread and the API threads change it only holding `mu` (one re-entrant lock);
`wake` makes the tick run early. The store is the truth: everything here can be rebuilt from it
(`Controller._load`), except what is waiting for the next commit (`unrecorded*`) and the units
draining (after a restart those are stale copies, stopped when their host lists them).

A job that holds resources is an `Active`; one of its units asked to stop after its job ended, but
still holding what it held until its host says it ended, is `Draining`.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.merge import Effective, Profile
from xce_lite.config.sched_view import Holding, host_totals, queue_policies
from xce_lite.controller import permissions
from xce_lite.controller.active import ActiveJobs
from xce_lite.controller.pending_set import PendingSet
from xce_lite.exec.host import JobResult
from xce_lite.models import Job
from xce_lite.sched.core import PendingJob, QueuePolicy
from xce_lite.sched.placement import HostView
from xce_lite.sched.projects import Projects
from xce_lite.sched.reasons import HostAlloc
from xce_lite.store.jobs import Finish, Requeue

NEW, SENT, RUNNING, ENDED = "new", "sent", "running", "ended"


@dataclass
class Active:
    """A job that holds resources on hosts: DISP or RUN (or suspended), with its units."""

    id: int
    user: str
    queue: str
    state: str
    attempt: int
    holding: Holding
    units: tuple[str, ...]  # one per host of holding.allocs, first host first
    status: list[str]  # per unit: NEW, SENT, RUNNING, ENDED
    results: dict[int, JobResult] = field(default_factory=dict)  # of the units that ENDED
    ending: bool = False  # its finish or requeue is on its way to the store
    array_id: int | None = None  # an array's element
    retry: int = 0  # --retry: a failed attempt is requeued while retries < retry
    retry_on: tuple[int, ...] | None = None  # only for these exit codes (None: any failure)
    retries: int = 0
    killed: str | None = None  # the kill's reason once someone killed it: never retried nor requeued (kills.py)
    project: str | None = None  # its project (limits, fair share by project)
    since: float = 0.0  # when it was dispatched or started: fair share counts its time from then
    # what its launch needs, carried from the plan that dispatched it (its row as the dispatch stored
    # it, and its effective values): a launch then reads nothing back from the store. None after a
    # restart (recovery.py): a launch reads the stored row, a rare path
    launch_with: LaunchWith | None = None
    # a queued successor (prefilling.py): the job whose unit it follows on its host, and whether it
    # holds nothing of its own now (that job is active and not ending in this tick)
    after: int | None = None
    queued: bool = False
    withdrawing: bool = False  # asked its host to drop it from the queue; the host's answer decides

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        return self.holding.hosts

    def host_of(self, index: int) -> str:
        return self.holding.allocs[index].host


@dataclass(frozen=True)
class LaunchWith:
    """A dispatched job's row as its dispatch stored it, the effective values it runs with, and what
    it holds (its plan's: equal to the row's alloc)."""

    row: Job
    effective: Effective | None
    holding: Holding | None = None


@dataclass(frozen=True)
class Draining:
    """A unit of a job that ended or was requeued, asked to stop, still holding `alloc`."""

    job_id: int
    alloc: HostAlloc

    @property
    def host(self) -> str:
        return self.alloc.host


@dataclass
class ControllerState:
    """See the module docstring. The configuration's fields are replaced together by
    handlers/config.use_config (at start, and by a reconfig), holding `mu`."""

    # the configuration in use, and what is derived from it (`use`)
    config: ClusterConfig
    profiles: dict[str, Profile]  # application profiles by name (profiles.py)
    host_totals: tuple[HostView, ...] = field(init=False)  # each host's totals (pool hosts too: pool_views.py)
    addresses: dict[str, str] = field(init=False)  # how a hostfile names a host
    queue_policies: tuple[QueuePolicy, ...] = field(init=False)  # a pool stands for its hosts (pool_views.py)
    permission_policy: permissions.Policy = field(init=False)  # who may act on which job (shared.py)
    project_view: Projects = field(init=False)  # projects, defaults and limits (sched/projects.py)
    # the lock of everything here, and the tick's wake-up
    mu: threading.RLock = field(default_factory=threading.RLock)
    wake: threading.Event = field(default_factory=threading.Event)
    # jobs that hold resources, and their units
    active: ActiveJobs = field(default_factory=ActiveJobs)  # a dict that keeps what sessions read (active.py)
    by_unit: dict[str, tuple[int, int]] = field(default_factory=dict)  # unit -> (job id, index)
    draining: dict[str, Draining] = field(default_factory=dict)
    behind: dict[int, int] = field(default_factory=dict)  # successor job -> its predecessor (prefilling.py)
    # a successor's request as a dispatch sees it (to withdraw it to free room: prefilling.py)
    behind_requests: dict[int, PendingJob] = field(default_factory=dict)
    # hosts
    links: dict[str, Any] = field(default_factory=dict)  # host -> its HostLink (exec/link.py)
    hosts: dict[str, Any] = field(default_factory=dict)  # host name -> its connected Host
    host_state: dict[str, str] = field(default_factory=dict)  # "ok" or "unreachable" (the scheduler reads it)
    generation: dict[str, int] = field(default_factory=dict)  # host -> the link generation of its HostUp
    down_since: dict[str, float] = field(default_factory=dict)  # host -> since when it is out of reach
    down_why: dict[str, str] = field(default_factory=dict)  # host -> why (the link's last word)
    lost_hosts: set[str] = field(default_factory=set)  # out of reach past the grace: their jobs were handled
    probes: dict[str, Any] = field(default_factory=dict)  # host -> its last HostProbe
    # jobs that hold nothing
    pending: PendingSet = field(default_factory=PendingSet)
    held: dict[int, str] = field(default_factory=dict)  # PSUSP job id -> user
    attempts: dict[int, int] = field(default_factory=dict)  # pending job id -> its last attempt, if it ran
    retries: dict[int, int] = field(default_factory=dict)  # job id -> its retries so far, plan to dispatch
    reasons: dict[int, str | None] = field(default_factory=dict)  # live pend reasons (the API shows these)
    stored_reasons: dict[int, str | None] = field(default_factory=dict)  # what the store holds
    # learned since the last commit, stored by the next tick
    unrecorded: list[tuple[Finish, str]] = field(default_factory=list)  # (finish, event kind)
    unrecorded_started: list[tuple[int, float]] = field(default_factory=list)
    store_starts_now: bool = False  # a request reads a start: the next tick commits starts at once (start_wait.py)
    unrecorded_requeues: list[Requeue] = field(default_factory=list)
    # (job id, kind, data) of units that ended after their job: stored by the tick's commit, before
    # the hosts may forget them
    host_hook_events: list[tuple[int, str, dict]] = field(default_factory=list)
    dirty: bool = True  # something changed since the last scheduling session
    gate_dirty: bool = True  # a state changed since the gate last decided (gating.py)
    full: bool = False  # the last session's hosts had no free slot: a submit need not wake the tick (submit_wake.py)
    deferred_jobs: int = 0  # jobs submitted since, their sessions waiting (submit_wake.DEFER_JOBS)
    deferred_since: float | None = None  # the first submit whose session waits, not taken by a tick yet
    last_submit: float = float("-inf")  # when the last submit came (submit_wake.STREAM_GAP)
    streaming: bool = False  # a submit of a stream woke the tick, which first gathers the next ones (sleeping.py)
    finished: threading.Condition = field(init=False)  # on `mu`
    # job id -> the waits (`xce wait`) asleep until it ends (wait_ended.py): a tick that ends none of
    # them wakes no waiter
    waited: Counter[int] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.use(self.config, self.profiles)
        self.finished = threading.Condition(self.mu)  # notified when jobs end (`xce wait`, flows)

    @property
    def cluster(self) -> str:
        return self.config.cluster

    def use(self, config: ClusterConfig, profiles: dict[str, Profile]) -> None:
        """Make `config` the one in use, with what is derived from it (holding `mu` once the
        controller runs). The pools' hosts are added to it by pool_views.py."""
        self.config, self.profiles = config, profiles
        self.host_totals = host_totals(config)
        self.addresses = {h.name: h.address for h in config.hosts if h.address}
        self.queue_policies = queue_policies(config)
        self.permission_policy = permissions.policy_of(config, os.geteuid())
        self.project_view = config.project_view()
