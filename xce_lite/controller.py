"""The controller: the single writer of the job store, the scheduler's caller, the hosts' master.

Its tick is a short list of named steps, each with one commit at most:

1. reconcile  - take what the hosts reported (units finished, agents lost) and record it;
2. snapshot   - hosts with what is free on them, pending jobs, queue priorities (memory only);
3. schedule   - run the pure scheduler core in its worker process (sched_process.py: forkserver,
                fed with what changed in the pending set since the last session);
4. intent     - record each dispatch as DISP with its deterministic unit name, BEFORE launching;
5. launch     - ask each host to start (or adopt) the units; record RUN, or EXIT if refused;
6. reasons    - store the pend reasons that changed (never a write per job per tick).

A restart is the same code: load the unfinished jobs, ask each host for its units, adopt what runs,
record what ended, relaunch what was recorded DISP but never reached its host (the unit name makes
that launch safe to repeat), and mark lost what vanished. A job acknowledged to a client is in the
store before the reply. API handlers run on the server's threads; they take `self._mu` for the
in-memory view, and the store serialises the writes.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from xce_lite import errors
from xce_lite.api import ApiServer
from xce_lite.config import ClusterConfig, QueueConfig
from xce_lite.exec.host import Host, HostEvent, HostLost, LaunchRequest, UnitFinished, UnitsLaunched
from xce_lite.exec.local import LocalHost
from xce_lite.handlers import ApiHandlers
from xce_lite.handlers_config import ConfigHandlers
from xce_lite.home import Home
from xce_lite.merge import Effective, Profile
from xce_lite.models import DISP, EXIT, PEND, PSUSP, RUN, Job, JobSpec, unit_name
from xce_lite.profiles import load_cluster
from xce_lite.sched.core import HOST_OK, Decisions, PendingJob, Snapshot
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.snapshot import Holding, effective, hosts_now, shared_free
from xce_lite.sched_process import PendingSet, SchedulerProcess
from xce_lite.store.jobs import Finish, JobStore, TickRecord


@dataclass
class Active:
    """A job that holds resources on hosts: DISP or RUN (suspended states come later)."""

    id: int
    user: str
    queue: str
    state: str
    unit: str
    holding: Holding

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        return self.holding.hosts


class _WakingQueue(queue.Queue):
    """Host events wake the tick as they arrive."""

    def __init__(self, wake: threading.Event):
        super().__init__()
        self._wake = wake

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        self._wake.set()


class Controller(ApiHandlers, ConfigHandlers):
    def __init__(self, home: Home, log=None):
        self.home = home
        self.log = log or _log
        self.config: ClusterConfig
        self.profiles: dict[str, Profile]  # application profiles by name (profiles.py)
        config, profiles = load_cluster(home.config)
        self.cluster = config.cluster
        home.spool.mkdir(exist_ok=True)
        self.store = JobStore(home.store)
        try:
            self._check_config(config, profiles)  # ConfigError: the controller does not start
        except errors.ConfigError:
            self.store.close()
            raise
        self._use_config(config, profiles)
        self.started_at = time.time()
        self._mu = threading.RLock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._finished = threading.Condition(self._mu)
        self._events: queue.Queue[HostEvent] = _WakingQueue(self._wake)
        self._hosts: dict[str, Host] = {}
        self._host_state: dict[str, str] = {}
        self._pending = PendingSet()
        self._held: dict[int, str] = {}  # PSUSP job id -> user
        self._active: dict[int, Active] = {}
        self._by_unit: dict[str, int] = {}
        self._to_launch: list[int] = []
        self._kill_marks: dict[int, str] = {}  # job id -> reason, for kills that raced a launch
        self._reasons: dict[int, str | None] = {}  # live pend reasons (the API shows these)
        self._stored_reasons: dict[int, str | None] = {}  # what the store holds
        self._reasons_flushed_at = 0.0
        # Learned since the last commit, stored by the next tick: (finish, event kind), (job, start).
        self._unrecorded: list[tuple[Finish, str]] = []
        self._unrecorded_started: list[tuple[int, float]] = []
        self._dirty = True  # something changed since the last scheduling session
        self._scheduler = SchedulerProcess()
        self._server: ApiServer | None = None

    # ---- running ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until stopped: start the pool, reach the hosts, adopt, serve the API, tick."""
        try:
            self._load()
            for host_config in self.config.hosts:
                self._connect_host(host_config.name)
            self._server = ApiServer(self.home.socket, self.routes(), self.log)
            threading.Thread(target=self._server.serve_forever, name="api", daemon=True).start()
            self.log(f"controller for cluster {self.cluster!r} serving at {self.home.socket}")
            while not self._stopping.is_set():
                self._wake.wait(self.config.controller.tick)
                self._wake.clear()
                if not self._stopping.is_set():
                    self.tick()
        finally:
            self._shutdown()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.home.socket.unlink(missing_ok=True)
        for host in self._hosts.values():
            host.close()  # the agents exit; the jobs go on under their supervisors
        self._scheduler.close()
        self.store.close()
        self.log("controller stopped")

    def _load(self) -> None:
        """Rebuild the in-memory view from the store (the store is the truth)."""
        for job in self.store.unfinished():
            if job.state == PEND:
                self._pending.add(self.pending_job(job.id, job.user, job.queue, job.spec, job.submit_time))
                self._reasons[job.id] = self._stored_reasons[job.id] = job.pend_reason
            elif job.state == PSUSP:
                self._held[job.id] = job.user
            else:
                holding = Holding.from_json(job.alloc, job.hosts)
                self._active[job.id] = Active(job.id, job.user, job.queue, job.state, job.unit or "", holding)
                self._by_unit[job.unit or ""] = job.id
        if self._active:
            self.log(f"recovering {len(self._active)} dispatched or running jobs")

    def _connect_host(self, name: str) -> None:
        host = LocalHost(name, self.home.spool / name)
        try:
            probe = host.connect(self._events)
        except errors.ExecError as err:
            self._host_state[name] = "unreachable"
            self.log(f"host {name} is unreachable: {err}")
            return
        self._hosts[name] = host
        self._host_state[name] = HOST_OK
        self.log(f"host {name}: agent up ({probe.cpus} cpus)")
        self._adopt(name, host)

    def _adopt(self, name: str, host: Host) -> None:
        """Match the host's units with the store's active jobs (after a start or a reconnect).

        What it learns is recorded by the next tick, like anything a host reports.
        """
        listed = {info.unit: info for info in host.list_units()}
        forget = []
        now = time.time()
        with self._mu:
            for unit, info in listed.items():
                job_id = self._by_unit.get(unit)
                if job_id is None:
                    if info.status == "finished":
                        forget.append(unit)  # recorded already; the controller died before forgetting
                    continue
                if info.status == "finished" and info.result is not None:
                    self._events.put(UnitFinished(name, unit, info.result))
                elif self._active[job_id].state == DISP:
                    self._mark_running(job_id, info.start_time or now)
            for job in self._active.values():
                if job.unit in listed or job.hosts[0][0] != name:
                    continue
                if job.state == DISP:
                    self._to_launch.append(job.id)  # recorded, never reached the host: launch it now
                else:
                    self._unrecorded.append((Finish(job.id, job.state, EXIT, None, now, None, None, None, None,
                                                    f"lost: unit {job.unit} vanished from host {name}"), "lost"))
        if forget:
            host.forget(forget, wait=False)
        self._wake.set()

    # ---- the tick ---------------------------------------------------------------------------

    def tick(self) -> None:
        """One pass; see the module docstring. Everything learned and decided in it is stored in
        one durable commit, before any launch; launch replies are stored by the next pass."""
        now = time.time()
        finishing, done_units, lost_hosts = self._collect_events()
        with self._mu:
            finishing += self._unrecorded
            started, self._unrecorded, self._unrecorded_started = self._unrecorded_started, [], []
            closing = {f.job_id for f, _event in finishing}
            dirty, self._dirty = self._dirty or bool(closing), False
            hosts = self._hosts_now(closing) if dirty and self._pending else None
            shared = self._shared_free(closing) if hosts is not None else None
            relaunch, self._to_launch = self._to_launch, []
        decisions = self._schedule(hosts, shared) if hosts is not None else None
        plans = self._plans(decisions) if decisions is not None else []
        reasons = self._reasons_to_store(decisions, now)
        if finishing or started or plans or reasons:
            record = self.store.record_tick(finishing, started, plans, reasons, now)
            self._apply(record, finishing, plans)
        for name, units in done_units.items():  # only once their results are on disk
            host = self._hosts.get(name)
            if host is not None and self._host_state.get(name) == HOST_OK:
                host.forget(units, wait=False)
        for name in lost_hosts:
            self._reconnect(name)
        launch = relaunch + [job_id for job_id, *_ in plans if job_id in self._active]
        if launch:
            self._launch(launch)
        if self._kill_marks:
            self._deliver_kill_marks()
        if self._unrecorded or self._unrecorded_started:
            self._wake.set()  # store launch outcomes at once (with whatever else came meanwhile)

    def _collect_events(self) -> tuple[list[tuple[Finish, str]], dict[str, list[str]], set[str]]:
        """Drain host events: finishes to record, units to forget once recorded, hosts lost."""
        finishing: list[tuple[Finish, str]] = []
        seen: set[int] = set()  # a unit's finished event may come twice (adoption, relaunch)
        done_units: dict[str, list[str]] = defaultdict(list)
        lost_hosts = set()
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return finishing, done_units, lost_hosts
            if isinstance(event, HostLost):
                lost_hosts.add(event.host)
                continue
            if isinstance(event, UnitsLaunched):
                with self._mu:
                    self._launched(event, time.time())
                continue
            done_units[event.host].append(event.unit)
            with self._mu:
                job_id = self._by_unit.get(event.unit)
                job = self._active.get(job_id) if job_id is not None else None
            if job is not None and job.id not in seen:
                seen.add(job.id)
                finishing.append((_finish_from_result(job, event), "finished"))
            # job None: recorded already (a repeated event); the host may drop the unit

    def _reconnect(self, name: str) -> None:
        self.log(f"host {name}: agent lost; reconnecting")
        self._host_state[name] = "unreachable"
        old = self._hosts.pop(name, None)
        if old is not None:
            old.close()
        self._connect_host(name)
        self._dirty = True

    def pending_job(self, job_id: int, user: str, queue: str, spec: JobSpec, submit_time: float) -> PendingJob:
        """The scheduler's view of a pending job: its effective request (merge.py), computed live, so
        a changed profile or queue ceiling applies to jobs already waiting. A stored job that cannot
        be merged now (its profile or queue is gone, a reconfig made it unrunnable) is blocked with
        the reason: it pends, never EXIT, until the configuration lets it run or it is killed."""
        try:
            eff = effective(spec, queue, self.config, self.profiles)
        except errors.SpecError as err:
            return PendingJob(job_id, user, queue, JobRequest(job_id), spec.priority, submit_time,
                              blocked=f"cannot run as configured now: {err}")
        request = JobRequest(job_id, eff.min_tasks, eff.max_tasks, eff.resreq)
        return PendingJob(job_id, user, queue, request, spec.priority, submit_time, eff.profile_hash)

    def _hosts_now(self, closing: set[int] = frozenset()) -> tuple[HostView, ...]:
        """What is free on each host; jobs in `closing` finish in this tick: theirs is free again."""
        holdings = [job.holding for job in self._active.values() if job.id not in closing]
        return hosts_now(self.host_totals, self._host_state, holdings)

    def _shared_free(self, closing: set[int] = frozenset()):
        return shared_free(self.config, [j.holding for j in self._active.values() if j.id not in closing])

    def _schedule(self, hosts: tuple[HostView, ...], shared) -> Decisions | None:
        """One session in the scheduler process, fed with what changed in the pending set."""
        try:
            with self._mu:  # the pending set's changes are taken under the lock; the wait is not
                running = tuple((j.queue, j.user, sum(n for _, n in j.hosts)) for j in self._active.values())
                base = Snapshot(hosts, (), self.queue_policies, shared, running, time.time(),
                                self.config.controller.reserve_after)
                self._scheduler.send(self._pending, base, self.config.controller.sched_budget)
            decisions = self._scheduler.receive()
        except TimeoutError as err:
            self.log(f"{err}; it will be restarted")
            decisions = None
        if decisions is None:  # out of step or restarted: the next session sends the whole set
            self._dirty = True
            self._wake.set()
        return decisions

    def _plans(self, decisions: Decisions) -> list[tuple[int, int, list, str, dict, dict]]:
        """The dispatches to record, each with the effective values it will run with. A decision
        made on a profile that has changed or vanished since (a reconfig during the session), or
        whose task count the job's queue no longer allows, is declined: the job stays PEND and is
        scheduled again with what holds now, never EXIT."""
        if not decisions.dispatches:
            return []
        jobs = {job.id: job for job in self.store.jobs([d.job_id for d in decisions.dispatches])}
        plans = []
        for d in decisions.dispatches:
            job = jobs.get(d.job_id)
            if job is None or job.state != PEND:
                continue  # killed or held meanwhile: the store's guarded update would refuse it anyway
            declined = self._stale(job, d.profile_hash, sum(n for _, n in d.hosts))
            if isinstance(declined, str):
                self._decline(job.id, d.profile_hash, declined)
                continue
            attempt = 1  # retries and requeue come later; each new attempt gets a new unit name
            unit = unit_name(self.cluster, d.job_id, attempt, 0)
            plans.append((d.job_id, attempt, [list(h) for h in d.hosts], unit, Holding.of(d.placement).to_json(),
                          declined.to_json()))
        return plans

    def _stale(self, job: Job, decided_hash: str, tasks: int) -> Effective | str:
        """The job's effective values now, or why the decision taken for it no longer holds."""
        try:
            eff = effective(job.spec, job.queue, self.config, self.profiles)
        except errors.SpecError as err:
            return f"its configuration changed since the scheduler's decision: {err}"
        if eff.profile_hash != decided_hash:
            return (f"application {job.spec.app} changed since the scheduler's decision "
                    f"(hash {decided_hash or 'none'} -> {eff.profile_hash})")
        if not eff.min_tasks <= tasks <= eff.max_tasks:
            return f"its task range is now {eff.min_tasks}..{eff.max_tasks}, the decision gave it {tasks} tasks"
        return eff

    def _reasons_to_store(self, decisions: Decisions | None, now: float) -> dict[int, str | None]:
        """Keep every pend reason live in memory; hand the store the changed ones at most once a
        second, so a busy queue costs no write per job per tick (the API reads the live ones)."""
        with self._mu:
            if decisions is not None:
                for reason, ids in decisions.waiting:
                    for job_id in ids:
                        if job_id in self._pending:
                            self._reasons[job_id] = reason
            if now - self._reasons_flushed_at < 1.0:
                return {}
            self._reasons_flushed_at = now
            changed = {job_id: reason for job_id, reason in self._reasons.items()
                       if self._stored_reasons.get(job_id) != reason}
            self._stored_reasons.update(changed)
            return changed

    def _apply(self, record: TickRecord, finishing: list[tuple[Finish, str]], plans: list) -> None:
        """Bring the in-memory view in line with what `record_tick` stored."""
        with self._mu:
            for f, _event in finishing:
                self._kill_marks.pop(f.job_id, None)
                job = self._active.pop(f.job_id, None)
                if job is not None:
                    self._by_unit.pop(job.unit, None)
            dispatched = set(record.dispatched)
            for job_id, _attempt, _hosts, unit, alloc, *_effective in plans:
                pending = self._pending.get(job_id)
                if job_id not in dispatched or pending is None:
                    continue  # killed or held while the scheduler thought: it stays as it is now
                self._pending.discard(job_id)
                self._forget_reason(job_id)
                self._active[job_id] = Active(job_id, pending.user, pending.queue, DISP, unit,
                                              Holding.from_json(alloc, ()))
                self._by_unit[unit] = job_id
            if record.finished:
                self._dirty = True
                self._finished.notify_all()

    def _forget_reason(self, job_id: int) -> None:
        self._reasons.pop(job_id, None)
        self._stored_reasons.pop(job_id, None)

    def _mark_running(self, job_id: int, start_time: float) -> None:
        """The unit runs: RUN in memory now, in the store with the next tick's commit. Holds _mu."""
        self._active[job_id] = replace(self._active[job_id], state=RUN)
        self._unrecorded_started.append((job_id, start_time))

    def _launch(self, job_ids: list[int]) -> None:
        by_host: dict[str, list[LaunchRequest]] = defaultdict(list)
        ids_of: dict[str, int] = {}
        now = time.time()
        position = {job_id: i for i, job_id in enumerate(job_ids)}
        for job in sorted(self.store.jobs(job_ids), key=lambda j: position[j.id]):  # decision order
            if job.state != DISP or not job.hosts:
                continue
            with self._mu:
                kill_reason = self._kill_marks.pop(job.id, None)
                if kill_reason is not None:  # killed before it reached its host: it never starts
                    self._unrecorded.append((Finish(job.id, DISP, EXIT, None, now, None, None, None, None,
                                                    kill_reason + " before it started"), "launch_failed"))
                    continue
            request = _launch_request(job, self.config.controller.grace, self.config.queue(job.queue))
            by_host[job.hosts[0][0]].append(request)
            ids_of[request.unit] = job.id
        for name, requests in by_host.items():
            host = self._hosts.get(name)
            try:
                if host is None:
                    raise errors.HostUnreachable(f"host {name} is not connected")
                host.launch_nowait(requests)  # replies come back as a UnitsLaunched event
            except errors.HostUnreachable as err:
                self.log(f"host {name}: launch failed, will retry: {err}")
                with self._mu:
                    self._to_launch.extend(ids_of[r.unit] for r in requests)  # try again when it is back

    def _launched(self, event: UnitsLaunched, now: float) -> None:
        """A host's replies to a launch: RUN for started units, EXIT for refused ones. Holds _mu."""
        for reply in event.replies:
            job_id = self._by_unit.get(reply.unit)
            if job_id is None or self._active[job_id].state != DISP:
                continue
            if reply.status == "refused":
                self._unrecorded.append((Finish(job_id, DISP, EXIT, None, now, None, None, None, None,
                                                f"launch refused by host {event.host}: {reply.error}"),
                                         "launch_failed"))
            elif reply.status in ("started", "running"):
                self._mark_running(job_id, reply.start_time or now)
            # "finished": an adopted unit that already ended; its finished event follows
        for unit in event.failed:
            job_id = self._by_unit.get(unit)
            if job_id is not None and self._active[job_id].state == DISP:
                self._unrecorded.append((Finish(job_id, DISP, EXIT, None, now, None, None, None, None,
                                                f"launch failed on host {event.host}: {event.error}"),
                                         "launch_failed"))

    def _deliver_kill_marks(self) -> None:
        """Kills that arrived while their job's launch was in flight: signal the unit now."""
        with self._mu:
            marks = [(self._active[i], reason) for i, reason in self._kill_marks.items() if i in self._active]
        for job, reason in marks:
            host = self._hosts.get(job.hosts[0][0])
            if host is not None and host.signal(job.unit, "TERM", reason):
                with self._mu:
                    self._kill_marks.pop(job.id, None)


def _finish_from_result(job: Active, event: UnitFinished) -> Finish:
    r = event.result
    ok = r.exit_code == 0 and r.signal is None and r.reason is None
    return Finish(job.id, job.state, "DONE" if ok else EXIT, r.start_time, r.end_time, r.exit_code, r.signal,
                  r.cpu_time, r.max_rss, r.reason)


def _launch_request(job: Job, grace: float, queue: QueueConfig) -> LaunchRequest:
    """What the host needs to run the job: the effective values fixed at its dispatch (a job
    dispatched before those were stored gets its own limits, else its queue's)."""
    spec = job.spec
    eff = Effective.from_json(job.effective) if job.effective else None
    env = eff.job_environment(spec.env) if eff is not None else dict(spec.env)
    holding = Holding.from_json(job.alloc, job.hosts)
    env.update({"XCE_JOBID": str(job.id), "XCE_JOB_NAME": job.name, "XCE_QUEUE": job.queue,
                "XCE_SLOTS": str(sum(n for _, n in job.hosts)), "XCE_HOSTS": " ".join(h for h, _ in job.hosts),
                "XCE_HOST_NTASKS": str(job.hosts[0][1]), "XCE_ATTEMPT": str(job.attempt)})
    if eff is not None and eff.app:
        env["XCE_APP"] = eff.app
    gpus = holding.allocs[0].gpus if holding.allocs else ()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    if eff is None:
        return LaunchRequest(unit=job.unit or "", argv=spec.argv, env=env, cwd=spec.cwd, stdout=job.output_path(),
                             stderr=job.error_path(), run_limit=spec.run_limit or queue.run_limit,
                             mem_limit=spec.mem_limit or queue.mem_limit, grace=grace)
    return LaunchRequest(unit=job.unit or "", argv=eff.job_starter + spec.argv, env=env, cwd=spec.cwd,
                         stdout=job.output_path(), stderr=job.error_path(), run_limit=eff.run_limit,
                         mem_limit=eff.mem_limit, grace=grace, profile_env=dict(eff.profile_env))


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} {message}", file=sys.stderr, flush=True)


def run_foreground(home: Home) -> None:
    """Hold the home's lock and run the controller until stopped (SIGTERM or `xce controller stop`)."""
    import signal

    from xce_lite.daemon import hold_lock

    with hold_lock(home):
        controller = Controller(home)
        signal.signal(signal.SIGTERM, lambda *_: controller.stop())
        signal.signal(signal.SIGINT, lambda *_: controller.stop())
        controller.serve()

