"""The simulation engine: the controller's scheduler core and merge, on a simulated clock and hosts.

What is the controller's, shared and never copied: the submit checks and merge (`snapshot.admit`,
`snapshot.pending_job`), the queue policies (`snapshot.queue_policies`), what a host has free
(`snapshot.host_now`, per changed host), the shared counters (`snapshot.shared_free`) and the pure
core (`sched.core.schedule`). Hosts are fake Hosts behind the exec seam (exec/fake.py): a dispatch
launches a unit there, and its end comes back as a `UnitFinished` event, as from a real host.

A step is one simulated instant. Instants lie on a grid of `interval` seconds (the controller's
tick, by default): an event at t is seen at the first grid point at or after t, and everything due
by then is taken in one step, in this order (the controller's tick):

1. collect: the clock moves; units that ended finish their jobs (DONE, or EXIT with the reason);
2. submit: jobs due are admitted (or rejected, with why no host could ever run them); a job with
   a dependency waits for it, an array element for room under its array's %limit;
3. release: jobs whose dependency now holds, and array elements with room, join the pending set;
4. schedule: if anything changed and jobs are pending, ONE session of the core;
5. dispatch: each plan reserves its hosts and launches on the first; pend reasons are stored.

Jobs released by a dispatch (`started(x)`) or a session cut short by its budget make the next grid
point an instant of its own, as they would wake the controller. Time is only ever `self.now`:
nothing here reads a real clock. Deterministic: the same config and workload give the same steps.

Tracing: `step(traced)` keeps the `core.Examined` values of the jobs `traced` names (the core's
observer); they ride on the Step and are never recorded, so a trace cannot change a decision.
"""

from __future__ import annotations

import math
import queue
from collections.abc import Callable
from dataclasses import dataclass, field

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.merge import Effective, Profile
from xce_lite.config.sched_view import Holding, admit, host_now, host_totals, pending_job, queue_policies, shared_free
from xce_lite.errors import SpecError
from xce_lite.exec.fake import FakeCluster, sim_argv
from xce_lite.exec.host import LaunchRequest, UnitFinished
from xce_lite.models import DONE, EXIT, PEND, RUN, JobSpec
from xce_lite.sched.core import Decisions, Dispatch, PendingJob, SessionCache, Snapshot, schedule
from xce_lite.sched.placement import HostView, JobRequest, why_never
from xce_lite.sched.reasons import HostAlloc
from xce_lite.sim.gating import Workflows
from xce_lite.sim.projects import SimProjects
from xce_lite.sim.workload import Workload, WorkloadJob
from xce_lite.workflow import deps

WAITING, REJECTED = "WAIT", "REJECTED"  # not submitted yet; refused at submit


@dataclass(eq=False)
class SimJob:
    id: int
    entry: WorkloadJob
    name: str | None
    array: str | None = None  # the array's name, for an element
    array_id: int | None = None  # its array's id (the first element's job id), for an element
    index: int | None = None  # its index in the array
    state: str = WAITING
    queue: str = ""
    spec: JobSpec | None = None
    eff: Effective | None = None
    pending: PendingJob | None = None
    reason: str | None = None
    start: float | None = None
    end: float | None = None
    exit_code: int | None = None
    holding: Holding | None = None
    order: int = 0  # dispatch order: ties in end time finish in it


@dataclass(frozen=True)
class Step:
    """What one instant did. `reasons`: (reason, ids) of the jobs whose pend reason changed."""

    number: int
    time: float
    session: int | None
    finished: tuple[tuple[int, str, int | None], ...] = ()
    submitted: tuple[int, ...] = ()
    rejected: tuple[tuple[int, str], ...] = ()
    dispatched: tuple[Dispatch, ...] = ()
    reasons: tuple[tuple[str, tuple[int, ...]], ...] = ()
    pending: int = 0
    running: int = 0
    used: tuple[tuple[str, float], ...] = ()
    examined: tuple = field(default=(), compare=False)  # traced core.Examined values; never recorded

    def to_json(self) -> dict:
        """The recorded form: every decision and the accounting, nothing the trace adds."""
        return {"step": self.number, "t": self.time, "session": self.session,
                "finished": [list(f) for f in self.finished], "submitted": list(self.submitted),
                "rejected": [list(r) for r in self.rejected],
                "dispatched": [[d.job_id, [list(h) for h in d.hosts]] for d in self.dispatched],
                "reasons": [[r, list(ids)] for r, ids in self.reasons],
                "acct": {"pending": self.pending, "running": self.running, "used": dict(self.used)}}


class Simulator:
    def __init__(self, config: ClusterConfig, profiles: dict[str, Profile], workload: Workload,
                 interval: float | None = None) -> None:
        self.config, self.profiles, self.workload = config, profiles, workload
        if workload.needs_tick:
            raise SpecError(f"workload {workload.source} has `retry` or host events: only the controller's own tick "
                            f"simulates them (`xce sim run --tick`; the REPL does not run it yet)")
        self.interval = config.controller.tick if interval is None else interval
        if self.interval < 0:
            raise SpecError(f"interval {self.interval}: give 0 (every instant) or a positive number of seconds")
        self.totals = host_totals(config)
        self.policies = queue_policies(config)
        self.total_by_resource: dict[str, float] = {}
        for view in self.totals:
            for name, amount in view.total.items():
                self.total_by_resource[name] = self.total_by_resource.get(name, 0) + amount
        self.cluster = FakeCluster()
        self.events: queue.Queue = queue.Queue()
        for view in self.totals:
            self.cluster.host(view.name).connect(self.events)
        self.jobs: list[SimJob] = []  # by id - 1
        for entry in sorted(workload.jobs, key=lambda e: (e.submit, e.row)):
            if entry.after is not None:
                try:
                    deps.parse(entry.after)
                except SpecError as err:
                    raise SpecError(f"workload {workload.source}, job {entry.row}: {err}")
            if entry.array is None:
                self.jobs.append(SimJob(len(self.jobs) + 1, entry, entry.name))
                continue
            first = len(self.jobs) + 1
            for index in entry.array[1]:
                self.jobs.append(SimJob(len(self.jobs) + 1, entry, f"{entry.array[0]}[{index}]", entry.array[0],
                                        first, index))
        self.flows = Workflows(self.jobs)
        self.projects = SimProjects(config)  # projects and fair share, as the controller has them
        self._array_running: dict[int, int] = {}  # array id -> its elements running
        self.now = 0.0
        self.step_number = self.sessions = 0
        self._next_submit = 0  # index into self.jobs: the next not yet submitted (they are in submit order)
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, SimJob] = {}
        self._views = {v.name: v for v in self.totals}
        self._totals = dict(self._views)
        self._on_host: dict[str, dict[int, HostAlloc]] = {v.name: {} for v in self.totals}  # job -> its alloc there
        self._changed_hosts: set[str] = set()
        self._shared_holders: dict[int, Holding] = {}
        self._shared = shared_free(config, ())
        self._slots_used: dict[tuple[str, str], int] = {}
        self.used: dict[str, float] = dict.fromkeys(self.total_by_resource, 0)
        self.used_seconds: dict[str, float] = dict.fromkeys(self.total_by_resource, 0.0)
        self._dirty = False  # something changed that the next session must see
        self._wake = False  # the next grid point is an instant of its own (released jobs, a cut session)
        self._dispatches = 0
        self._never_memo: dict[tuple, str | None] = {}
        # What one session of the core leaves for the next: a session then costs the hosts that
        # changed, not all of them. It never changes a decision (sched/core.py, Carrying over).
        self._sessions = SessionCache()

    # ---- the clock

    def next_instant(self) -> float | None:
        """When the next step happens; None when nothing is left to happen."""
        times = []
        if self._next_submit < len(self.jobs):
            times.append(self.jobs[self._next_submit].entry.submit)
        end = self.cluster.next_end()
        if end is not None:
            times.append(end)
        if self._wake:
            times.append(self.now + self.interval)
        if not times:
            return None
        t = max(min(times), self.now)
        if self.interval > 0:
            t = math.ceil(t / self.interval) * self.interval
        return max(t, self.now)

    @property
    def finished(self) -> bool:
        return self.next_instant() is None

    @property
    def submitted_count(self) -> int:
        """Jobs submitted so far: they are `self.jobs[:submitted_count]` (jobs are in submit order)."""
        return self._next_submit

    def step(self, traced: Callable[[int], bool] | None = None) -> Step | None:
        """Run one instant (see the module docstring); None when the simulation is over. `traced`:
        which jobs' `core.Examined` values the step keeps (tracing reads, never decides)."""
        t = self.next_instant()
        if t is None:
            return None
        for name, amount in self.used.items():
            self.used_seconds[name] += amount * (t - self.now)
        self.now, self._wake = t, False
        self.step_number += 1
        finished = self._collect(t)
        submitted, rejected = self._submit(t)
        changed: dict[str, list[int]] = {}
        finished += self._gate(t, changed)
        session = None
        dispatched: tuple[Dispatch, ...] = ()
        examined: list = []
        if self._dirty and self.pending:
            self._dirty = False
            self.sessions += 1
            session = self.sessions
            observe = None if traced is None else (lambda e: examined.append(e) if traced(e.job_id) else None)
            decisions = schedule(self._snapshot(), self.config.controller.sched_budget, observe, self._sessions)
            dispatched = decisions.dispatches
            self._apply(decisions, changed)
            if not decisions.complete:
                self._dirty = self._wake = True
        if dispatched and self.flows.started_matters and len(self.flows.gate):  # started(x): look again next
            self.flows.dirty = self._wake = True
        return Step(self.step_number, t, session, tuple(finished), tuple(submitted), tuple(rejected), dispatched,
                    tuple((r, tuple(ids)) for r, ids in changed.items()),
                    len(self.pending) + len(self.flows.gate) - len(self.flows.gate.fed), len(self.running),
                    tuple(self.used.items()), tuple(examined))

    # ---- the tick's phases

    def _collect(self, t: float) -> list[tuple[int, str, int | None]]:
        self.cluster.advance(t)
        finished = []
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                break
            if not isinstance(event, UnitFinished):
                continue
            job = self.running.pop(int(event.unit.split("-")[1]))
            result = event.result
            job.state = DONE if result.exit_code == 0 else EXIT
            job.end, job.exit_code, job.reason = result.end_time, result.exit_code, result.reason
            self._release_holding(job)
            self.projects.finished(job)
            self.cluster.host(event.host).forget([event.unit])
            finished.append((job.id, job.state, job.exit_code))
        if finished:
            self._dirty = self.flows.dirty = True
        return finished

    def _submit(self, t: float) -> tuple[list[int], list[tuple[int, str]]]:
        submitted, rejected = [], []
        while self._next_submit < len(self.jobs) and self.jobs[self._next_submit].entry.submit <= t:
            job = self.jobs[self._next_submit]
            self._next_submit += 1
            try:
                self._admit(job)
                expr = self.flows.resolve(job)
            except SpecError as err:
                job.state, job.reason = REJECTED, str(err)
                rejected.append((job.id, str(err)))
                continue
            job.state = PEND
            self.flows.register(job)
            submitted.append(job.id)
            if not self.flows.add(job, expr):
                self._to_pending(job)
        return submitted, rejected

    def _admit(self, job: SimJob) -> None:
        """The controller's submit checks and merge; SpecError if it would refuse the job."""
        e = job.entry
        spec = JobSpec(argv=sim_argv(e.runtime, e.exit_code), cwd="/", name=job.name, queue=e.queue,
                       slots=e.slots, max_slots=e.max_slots, resreq=e.resreq, run_limit=e.run_limit,
                       mem_limit=e.mem_limit, priority=e.priority, app=e.app, project=e.project)
        job.spec, job.queue, job.eff = admit(spec, self.config, self.profiles, self.totals, self._never)
        job.spec = self.projects.admit(job.spec, e.user, job.eff)

    def _never(self, request: JobRequest) -> str | None:
        """`why_never` on the cluster's totals, memoised by request shape (it reads nothing else)."""
        key = (request.min_tasks, request.max_tasks, request.resreq)
        if key not in self._never_memo:
            self._never_memo[key] = why_never(request, self.totals, self.config.shared)
        return self._never_memo[key]

    def _gate(self, t: float, changed: dict[str, list[int]]) -> list[tuple[int, str, int | None]]:
        """The controller's gate step: feed what may start, take back what may not, cancel what never
        can (EXIT with the reason); the others' reasons say what they wait for."""
        decision = self.flows.decide(self._array_running)
        if decision is None:
            return []
        for job_id in decision.feed:
            self._to_pending(self.jobs[job_id - 1])
        for job_id in decision.unfeed:
            self.pending.pop(job_id, None)
        cancelled = []
        for job_id, reason in decision.cancel:
            job = self.jobs[job_id - 1]
            self.flows.gate.remove(job_id)
            self.pending.pop(job_id, None)
            job.state, job.end, job.reason = EXIT, t, reason
            cancelled.append((job_id, EXIT, None))
        if cancelled:  # their dependants learn it at the next grid point, as in the controller's next tick
            self.flows.dirty = self._wake = True
        for job_id, reason in decision.reasons.items():
            self._wait(self.jobs[job_id - 1], reason, changed)
        return cancelled

    @staticmethod
    def _wait(job: SimJob, reason: str, changed: dict[str, list[int]]) -> None:
        if job.reason != reason:
            job.reason = reason
            changed.setdefault(reason, []).append(job.id)

    def _to_pending(self, job: SimJob) -> None:
        job.pending = pending_job(job.id, job.entry.user, job.queue, job.spec, job.entry.submit, self.config,
                                  self.profiles)[0]
        self.pending[job.id] = job.pending
        self._dirty = True

    def host_views(self) -> list[HostView]:
        """Every host as the scheduler sees it now (free amounts)."""
        for name in self._changed_hosts:  # only the hosts whose holdings changed are built again
            self._views[name] = host_now(self._totals[name], "ok", self._on_host[name].values())
        self._changed_hosts.clear()
        return list(self._views.values())

    def jobs_on(self, host: str) -> int:
        return len(self._on_host[host])

    def _snapshot(self) -> Snapshot:
        self.host_views()
        running = tuple((q, u, n) for (q, u), n in self._slots_used.items() if n)
        return Snapshot(tuple(self._views.values()), tuple(self.pending.values()), self.policies, self._shared,
                        running, self.now, self.config.controller.reserve_after,
                        **self.projects.inputs(list(self.running.values()), self.now))

    def _apply(self, decisions: Decisions, changed: dict[str, list[int]]) -> None:
        for d in decisions.dispatches:
            job = self.jobs[d.job_id - 1]
            del self.pending[job.id]
            self.flows.gate.remove(job.id)
            if job.array_id is not None:
                self._array_running[job.array_id] = self._array_running.get(job.array_id, 0) + 1
            self._dispatches += 1
            job.state, job.start, job.order, job.reason = RUN, self.now, self._dispatches, None
            self._hold(job, Holding.of(d.placement))
            self._launch(job, d.hosts[0][0])
        for reason, ids in decisions.waiting:
            for job_id in ids:
                self._wait(self.jobs[job_id - 1], reason, changed)

    def _launch(self, job: SimJob, first_host: str, start: float | None = None) -> None:
        request = LaunchRequest(unit=f"sim-{job.id}-1-0", argv=job.spec.argv, env={}, cwd="/", stdout="/dev/null",
                                stderr=None, run_limit=job.eff.run_limit, mem_limit=job.eff.mem_limit)
        host = self.cluster.host(first_host)
        reply = host.launch([request])[0] if start is None else host.start_at(request, start)
        if reply.status != "started":
            raise RuntimeError(f"the fake host refused job {job.id}: {reply.error}")  # a bug, not input

    def _hold(self, job: SimJob, holding: Holding) -> None:
        job.holding = holding
        self.running[job.id] = job
        for alloc in holding.allocs:
            self._on_host[alloc.host][job.id] = alloc
            self._changed_hosts.add(alloc.host)
            for name, amount in alloc.reserved.items():
                self.used[name] = self.used.get(name, 0) + amount
        if holding.shared:
            self._shared_holders[job.id] = holding
            self._shared = shared_free(self.config, self._shared_holders.values())
        key = (job.queue, job.entry.user)
        self._slots_used[key] = self._slots_used.get(key, 0) + sum(a.tasks for a in holding.allocs)

    def _release_holding(self, job: SimJob) -> None:
        holding = job.holding
        for alloc in holding.allocs:
            del self._on_host[alloc.host][job.id]
            self._changed_hosts.add(alloc.host)
            for name, amount in alloc.reserved.items():
                self.used[name] -= amount
        if self._shared_holders.pop(job.id, None) is not None:
            self._shared = shared_free(self.config, self._shared_holders.values())
        key = (job.queue, job.entry.user)
        self._slots_used[key] -= sum(a.tasks for a in holding.allocs)
        if job.array_id is not None:
            self._array_running[job.array_id] -= 1

    # ---- snapshots of the simulated state

    def state(self) -> dict:
        """Everything a later `restore` needs to go on exactly as this run would (JSON-able)."""
        jobs = [[j.id, j.state, j.reason, j.start, j.end, j.exit_code, j.order,
                 j.holding.to_json() if j.state == RUN else None] for j in self.jobs[:self._next_submit]]
        return {"now": self.now, "step": self.step_number, "sessions": self.sessions, "submitted": self._next_submit,
                "dispatches": self._dispatches, "dirty": self._dirty, "wake": self._wake,
                "used_seconds": self.used_seconds, "jobs": jobs, "pending": list(self.pending),
                "gate": sorted(self.flows.gate.waiters), "fed": sorted(self.flows.gate.fed),
                "gate_dirty": self.flows.dirty, "fairshare": self.projects.state()}

    def restore(self, state: dict) -> None:
        """Take up a `state()` of a simulation of the same config and workload (checked by the caller)."""
        self.now, self.step_number, self.sessions = state["now"], state["step"], state["sessions"]
        self._next_submit, self._dispatches = state["submitted"], state["dispatches"]
        self._wake = state["wake"]
        self.used_seconds = dict(state["used_seconds"])
        self.cluster.now = self.now
        running = []
        gated = set(state["gate"])
        for job_id, job_state, reason, start, end, exit_code, order, holding in state["jobs"]:
            job = self.jobs[job_id - 1]
            job.state, job.reason, job.start, job.end, job.exit_code, job.order = (
                job_state, reason, start, end, exit_code, order)
            if job_state != REJECTED:
                self._admit(job)
                expr = self.flows.resolve(job)  # names mean what they meant when it was submitted
                self.flows.register(job)
                if job_id in gated:
                    self.flows.add(job, expr)
            if job_state == RUN:
                running.append((order, job, Holding.from_json(holding, ())))
        for _, job, holding in sorted(running, key=lambda r: r[0]):  # launch order breaks ties in end time
            self._hold(job, holding)
            self._launch(job, holding.allocs[0].host, job.start)
            if job.array_id is not None:
                self._array_running[job.array_id] = self._array_running.get(job.array_id, 0) + 1
        for job_id in state["pending"]:
            self._to_pending(self.jobs[job_id - 1])
        self._dirty = state["dirty"]
        self.flows.gate.fed = set(state["fed"])
        self.flows.dirty = state["gate_dirty"]
        self.projects.restore(state.get("fairshare") or {})
