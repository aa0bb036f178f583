"""The controller: the single writer of the job store, the scheduler's caller, the hosts' master.

Its tick is a short list of named steps, each with one commit at most:

1. reconcile  - take what the hosts reported (units finished, agents lost) and record it;
2. snapshot   - hosts with the slots they hold, pending jobs, queue priorities (memory only);
3. schedule   - run the pure scheduler core in a `multiprocessing` pool (forkserver: no store
                connection or host channel is ever copied into a child);
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

import multiprocessing
import queue
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from xce_lite import errors
from xce_lite.api import ApiServer
from xce_lite.config import ClusterConfig, load_config
from xce_lite.exec.host import Host, HostEvent, HostLost, LaunchRequest, UnitFinished
from xce_lite.exec.local import LocalHost
from xce_lite.handlers import ApiHandlers
from xce_lite.home import Home
from xce_lite.models import DISP, EXIT, PEND, PSUSP, RUN, Job, unit_name
from xce_lite.sched.core import HOST_OK, Decisions, HostState, PendingJob, Snapshot, schedule
from xce_lite.store.jobs import Finish, JobStore


@dataclass
class Active:
    """A job that holds slots on hosts: DISP or RUN (suspended states come later)."""

    id: int
    user: str
    state: str
    unit: str
    hosts: tuple[tuple[str, int], ...]


class _WakingQueue(queue.Queue):
    """Host events wake the tick as they arrive."""

    def __init__(self, wake: threading.Event):
        super().__init__()
        self._wake = wake

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        self._wake.set()


class Controller(ApiHandlers):
    def __init__(self, home: Home, log=None):
        self.home = home
        self.log = log or _log
        self.config: ClusterConfig = load_config(home.config)
        self.cluster = self.config.cluster
        home.spool.mkdir(exist_ok=True)
        self.store = JobStore(home.store)
        self.started_at = time.time()
        self._mu = threading.RLock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._finished = threading.Condition(self._mu)
        self._events: queue.Queue[HostEvent] = _WakingQueue(self._wake)
        self._hosts: dict[str, Host] = {}
        self._host_state: dict[str, str] = {}
        self._pending: dict[int, PendingJob] = {}
        self._held: dict[int, str] = {}  # PSUSP job id -> user
        self._active: dict[int, Active] = {}
        self._by_unit: dict[str, int] = {}
        self._to_launch: list[int] = []
        self._kill_marks: dict[int, str] = {}  # job id -> reason, for kills that raced a launch
        self._reasons: dict[int, str | None] = {}
        self._dirty = True  # something changed since the last scheduling session
        self._pool = None
        self._server: ApiServer | None = None

    # ---- running ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until stopped: start the pool, reach the hosts, adopt, serve the API, tick."""
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["xce_lite.sched.core"])
        self._pool = ctx.Pool(1)
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
        if self._pool is not None:
            self._pool.terminate()
        self.store.close()
        self.log("controller stopped")

    def _load(self) -> None:
        """Rebuild the in-memory view from the store (the store is the truth)."""
        for job in self.store.unfinished():
            if job.state == PEND:
                self._pending[job.id] = PendingJob(job.id, job.user, job.queue, job.spec.slots)
                self._reasons[job.id] = job.pend_reason
            elif job.state == PSUSP:
                self._held[job.id] = job.user
            else:
                self._active[job.id] = Active(job.id, job.user, job.state, job.unit or "", job.hosts)
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
        """Match the host's units with the store's active jobs (after a start or a reconnect)."""
        listed = {info.unit: info for info in host.list_units()}
        forget, started = [], []
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
                    started.append((job_id, info.start_time or now))
            lost = []
            for job in self._active.values():
                if job.unit in listed or job.hosts[0][0] != name:
                    continue
                if job.state == DISP:
                    self._to_launch.append(job.id)  # recorded, never reached the host: launch it now
                else:
                    lost.append(job)
        if started:
            self._record_started(started, now)
        for job in lost:
            self._finish_jobs([Finish(job.id, job.state, EXIT, None, now, None, None, None, None,
                                      f"lost: unit {job.unit} vanished from host {name}")], now, "lost")
        if forget:
            host.forget(forget)

    # ---- the tick ---------------------------------------------------------------------------

    def tick(self) -> None:
        self._reconcile()
        with self._mu:
            dirty, self._dirty = self._dirty, False
            snapshot = self._snapshot() if dirty and self._pending else None
            relaunch, self._to_launch = self._to_launch, []
        decisions = self._schedule(snapshot) if snapshot is not None else None
        dispatched = self._record_intent(decisions) if decisions else []
        if dispatched or relaunch:
            self._launch(relaunch + dispatched)
        if self._kill_marks:
            self._deliver_kill_marks()
        if decisions is not None:
            self._store_reasons(decisions)

    def _reconcile(self) -> None:
        finishes: list[Finish] = []
        done_units: dict[str, list[str]] = defaultdict(list)
        lost_hosts = set()
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            if isinstance(event, HostLost):
                lost_hosts.add(event.host)
                continue
            with self._mu:
                job_id = self._by_unit.get(event.unit)
                job = self._active.get(job_id) if job_id is not None else None
            if job is None:
                done_units[event.host].append(event.unit)  # already recorded: let the host drop it
                continue
            finishes.append(_finish_from_result(job, event))
            done_units[event.host].append(event.unit)
        if finishes:
            self._finish_jobs(finishes, time.time())
        for name, units in done_units.items():
            host = self._hosts.get(name)
            if host is not None and self._host_state.get(name) == HOST_OK:
                try:
                    host.forget(units)
                except errors.ExecError as err:
                    self.log(f"host {name}: could not forget units: {err}")
        for name in lost_hosts:
            self.log(f"host {name}: agent lost; reconnecting")
            self._host_state[name] = "unreachable"
            old = self._hosts.pop(name, None)
            if old is not None:
                old.close()
            self._connect_host(name)
            self._dirty = True

    def _finish_jobs(self, finishes: list[Finish], now: float, event: str = "finished") -> None:
        moved = set(self.store.finish(finishes, now, event))
        with self._mu:
            for f in finishes:
                self._kill_marks.pop(f.job_id, None)
                job = self._active.pop(f.job_id, None)
                if job is not None:
                    self._by_unit.pop(job.unit, None)
            self._dirty = True
            if moved:
                self._finished.notify_all()

    def _snapshot(self) -> Snapshot:
        used: dict[str, int] = defaultdict(int)
        for job in self._active.values():
            for host, tasks in job.hosts:
                used[host] += tasks
        hosts = tuple(HostState(h.name, h.slots, used[h.name], self._host_state.get(h.name, "unreachable"))
                      for h in self.config.hosts)
        jobs = tuple(self._pending[i] for i in sorted(self._pending))
        priorities = tuple((q.name, q.priority) for q in self.config.queues)
        return Snapshot(hosts, jobs, priorities)

    def _schedule(self, snapshot: Snapshot) -> Decisions | None:
        try:
            return self._pool.apply_async(schedule, (snapshot, self.config.controller.sched_budget)).get(60)
        except multiprocessing.TimeoutError:
            self.log("the scheduler took over 60 s; skipping this session")
            self._dirty = True
            return None

    def _record_intent(self, decisions: Decisions) -> list[int]:
        if not decisions.dispatches:
            return []
        plans = []
        for d in decisions.dispatches:
            attempt = 1  # retries and requeue come later; each new attempt gets a new unit name
            plans.append((d.job_id, attempt, [list(h) for h in d.hosts], unit_name(self.cluster, d.job_id, attempt, 0)))
        moved = set(self.store.dispatch(plans, time.time()))
        with self._mu:
            for job_id, _attempt, hosts, unit in plans:
                pending = self._pending.get(job_id)
                if job_id not in moved or pending is None:
                    continue  # killed or held while the scheduler thought: it stays as it is now
                del self._pending[job_id]
                self._reasons.pop(job_id, None)
                self._active[job_id] = Active(job_id, pending.user, DISP, unit, tuple(tuple(h) for h in hosts))
                self._by_unit[unit] = job_id
        return [p[0] for p in plans if p[0] in moved]

    def _launch(self, job_ids: list[int]) -> None:
        by_host: dict[str, list[LaunchRequest]] = defaultdict(list)
        ids_of: dict[str, int] = {}
        now = time.time()
        started, refused = [], []
        for job in sorted(self.store.jobs(job_ids), key=lambda j: job_ids.index(j.id)):  # decision order
            if job.state != DISP or not job.hosts:
                continue
            with self._mu:
                kill_reason = self._kill_marks.pop(job.id, None)
            if kill_reason is not None:  # killed before it reached its host: it never starts
                refused.append(Finish(job.id, DISP, EXIT, None, now, None, None, None, None,
                                      kill_reason + " before it started"))
                continue
            request = _launch_request(job, self.config.controller.grace)
            by_host[job.hosts[0][0]].append(request)
            ids_of[request.unit] = job.id
        for name, requests in by_host.items():
            host = self._hosts.get(name)
            if host is None:
                with self._mu:
                    self._to_launch.extend(ids_of[r.unit] for r in requests)  # try again when it is back
                continue
            try:
                replies = host.launch(requests)
            except errors.HostUnreachable as err:
                self.log(f"host {name}: launch failed, will retry: {err}")
                with self._mu:
                    self._to_launch.extend(ids_of[r.unit] for r in requests)
                continue
            for reply in replies:
                job_id = ids_of[reply.unit]
                if reply.status == "refused":
                    refused.append(Finish(job_id, DISP, EXIT, None, now, None, None, None, None,
                                          f"launch refused by host {name}: {reply.error}"))
                elif reply.status in ("started", "running"):
                    started.append((job_id, reply.start_time or now))
                # "finished": an adopted unit that already ended; its finished event is on its way
        if started:
            self._record_started(started, now)
        if refused:
            self._finish_jobs(refused, now, "launch_failed")

    def _deliver_kill_marks(self) -> None:
        """Kills that arrived while their job's launch was in flight: signal the unit now."""
        with self._mu:
            marks = [(self._active[i], reason) for i, reason in self._kill_marks.items() if i in self._active]
        for job, reason in marks:
            host = self._hosts.get(job.hosts[0][0])
            if host is not None and host.signal(job.unit, "TERM", reason):
                with self._mu:
                    self._kill_marks.pop(job.id, None)

    def _record_started(self, started: list[tuple[int, float]], now: float) -> None:
        moved = self.store.started(started, now)
        with self._mu:
            for job_id in moved:
                if job_id in self._active:
                    self._active[job_id] = replace(self._active[job_id], state=RUN)

    def _store_reasons(self, decisions: Decisions) -> None:
        changed = {}
        with self._mu:
            for job_id, reason in decisions.pend_reasons:
                if job_id in self._pending and self._reasons.get(job_id) != reason:
                    self._reasons[job_id] = reason
                    changed[job_id] = reason
        self.store.set_pend_reasons(changed)


def _finish_from_result(job: Active, event: UnitFinished) -> Finish:
    r = event.result
    ok = r.exit_code == 0 and r.signal is None and r.reason is None
    return Finish(job.id, job.state, "DONE" if ok else EXIT, r.start_time, r.end_time, r.exit_code, r.signal,
                  r.cpu_time, r.max_rss, r.reason)


def _launch_request(job: Job, grace: float) -> LaunchRequest:
    spec = job.spec
    env = dict(spec.env)
    env.update({"XCE_JOBID": str(job.id), "XCE_JOB_NAME": job.name, "XCE_QUEUE": job.queue,
                "XCE_SLOTS": str(spec.slots), "XCE_HOSTS": " ".join(h for h, _ in job.hosts),
                "XCE_ATTEMPT": str(job.attempt)})
    return LaunchRequest(unit=job.unit or "", argv=spec.argv, env=env, cwd=spec.cwd, stdout=job.output_path(),
                         stderr=job.error_path(), run_limit=spec.run_limit, mem_limit=spec.mem_limit, grace=grace)


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

