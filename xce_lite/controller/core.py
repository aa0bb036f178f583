"""The controller: the single writer of the job store, the scheduler's caller, the hosts' master.

Its tick is a short list of named steps, with one commit at most (and retention's own, step 8):

1. collect   - take what the hosts reported: units that ended, launch replies, hosts that came up
               (with the units they list, matched against the jobs by jobunits.reconcile) or went
               down (unitwork.py);
2. hosts lost- a host out of reach for `controller.host_lost_after`, and past the lease it may
               hold (leasework.py), is lost: its jobs are requeued (or end EXIT "host lost"; a job
               someone killed always ends EXIT with the kill's reason, kills.py), and a copy that
               runs there when it comes back is stopped;
3. gate      - pending jobs with a dependency, or in an array with a throttle, go to the scheduler
               when they may start; a dependency that can never hold cancels its job (gating.py);
4. snapshot  - hosts with what is free on them, pending jobs, queue priorities (memory only);
5. schedule  - run the pure scheduler core, a small session inline, a large one in the worker
               process (sched_switch.py), fed with what changed in the pending set;
6. intent    - ONE durable commit of everything learned and decided: starts, finishes, requeues
               (a failed attempt with retries left is requeued, not finished), cancels, each
               dispatch as DISP with its deterministic unit names, changed pend reasons;
7. act       - renew the hosts' leases (stored, then sent: leasework.py), forget the units whose
               results are stored, stop the units of jobs that ended or were requeued (they
               hold their resources, "draining", until their host says they ended), and
               launch (first) one unit per host of each dispatched job. Starts alone, and launch
               replies that only say the units run, wait for a later commit (start_wait.py);
8. retain    - at most one bounded batch of old finished jobs into the archive (retention.py).

A job placed on several hosts has a unit on each (jobunits.py): the first runs its command, the
others hold its allocation and run its `xce launch` tasks; its outcome is the first unit's.

The Controller is the composition root: it builds the shared state (state.py) and the parts, each
given what it reads and calls (no part holds the Controller): units (unitwork.py), gating,
dispatching, faults, kills (kill_marks.py), leases (leasework.py), pools, projects, task launches,
host links (links.py), and the API's routes (handlers/), which run on the server's threads and
turn requests into calls on the parts under the state's lock (a kill is marked for the tick to
deliver; suspend, resume and peek ask the job's host directly). A restart is the same code:
recovery.py loads the unfinished jobs; as each host comes up, what runs is adopted, what ended is
recorded, what was recorded DISP but never reached its host is launched (its unit name makes that
safe to repeat), stale copies are stopped, and what vanished is lost. A job acknowledged to a
client is in the store before the reply.

Seams (seams.py): the clock, the store, the hosts' links and connections, the signal workers and
the scheduler are given; `tick(now)` takes its time, and only `serve`'s loop reads the real clock.
tests/support/inproc.py runs it on fake hosts with a fake clock and no thread, checking
invariants.py after every tick. Faults (faults.py): a commit the store cannot take is retried with
backoff and loses nothing; a host that does not answer a signal is in trouble alone; only a fault
that makes going on unsafe stops the controller, saying why.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Set as AbstractSet
from functools import partial
from typing import Any

from xce_lite import errors
from xce_lite.api.server import ApiServer, Caller
from xce_lite.config.cluster import ClusterConfig, HostConfig
from xce_lite.config.profiles import load_cluster
from xce_lite.config.sched_view import pending_job
from xce_lite.controller.dispatching import Dispatching
from xce_lite.controller.fault_record import FaultRecord
from xce_lite.controller.faults import Faults, replan
from xce_lite.controller.host_trouble import HostTrouble
from xce_lite.controller.host_views import HostViews
from xce_lite.controller.store_retry import StoreRetry
from xce_lite.controller.gating import Gating
from xce_lite.controller.handlers.config import ConfigRoutes, check_config, use_config
from xce_lite.controller.handlers.flow import FlowRoutes
from xce_lite.controller.handlers.jobs import JobActions
from xce_lite.controller.handlers.submit import Submitting
from xce_lite.controller.handlers.views import JobViews
from xce_lite.controller.handlers.metrics import MetricsRoutes  # metrics:
from xce_lite.controller.kill_marks import KillMarks
from xce_lite.controller.kills import kill_wins
from xce_lite.controller.leasework import HostLeases
from xce_lite.controller.links import HostLinks
from xce_lite.controller.prefilling import Prefill
from xce_lite.controller.quiet_ends import QuietEnds
from xce_lite.controller.projects import ProjectShares
from xce_lite.controller.metrics import Registry  # metrics:
from xce_lite.controller.pool_views import PoolViews
from xce_lite.controller.pools import Pools, load_records
from xce_lite.controller.recovery import load
from xce_lite.controller.retention import Retention
from xce_lite.controller.seams import Seams, WakingQueue
from xce_lite.controller import sleeping, submit_wake
from xce_lite.controller.shared import Access, Handler, socket_mode, store_refusal
from xce_lite.controller.task_launches import TaskLaunches
from xce_lite.controller.state import RUNNING, SENT, Active, ControllerState
from xce_lite.controller.unitwork import Units
from xce_lite.exec.host import HostEvent
from xce_lite.home.paths import Home
from xce_lite.models import Job, JobSpec
from xce_lite.sched.core import Decisions, PendingJob, Snapshot
from xce_lite.sched.placement import HostView
from xce_lite.sched.reasons import FrozenMap
from xce_lite.store.jobs import JobStore, TickWrites


class Controller:
    """The composition root (module docstring): the state, the parts, `serve` and `tick(now)`."""

    @property
    def config(self) -> ClusterConfig:
        """The configuration in use (the state's)."""
        return self.state.config

    @property
    def cluster(self) -> str:
        return self.state.config.cluster

    def __init__(self, home: Home, log=None, seams: Seams | None = None):
        """`seams`: the clock, store, hosts and scheduler to use (seams.py); None: the real ones."""
        self.home, self.log = home, log or _log
        self.seams = seams = seams or Seams()
        self._clock = seams.clock
        config, profiles = load_cluster(home.config)
        self.state = ControllerState(config, profiles)  # what the parts share in memory (state.py)
        home.spool.mkdir(mode=0o700, exist_ok=True)
        self.store = seams.store if seams.store is not None else JobStore(home.store)
        try:
            check_config(config, profiles, self.store, self.log)  # ConfigError: the controller does not start
        except errors.ConfigError:
            self.store.close()
            raise
        self.pool_records = load_records(self.store)  # the pools' allocations (pool_views.py, pools.py)
        self.pool_views = PoolViews(self.state, self.pool_records, self._clock)
        use_config(self.state, self.pool_views, self.store, home, config, profiles, self._clock.time())
        self.started_at = self._clock.time()
        self.metrics = Registry()  # metrics: counters and durations for /metrics
        self._stopping = threading.Event()
        self.quiet_ends = QuietEnds(self.state, self._clock, seams.end_waits)  # launch replies, ends behind chains
        self._events: queue.Queue[HostEvent] = WakingQueue(self.state.wake, self.quiet_ends)
        self.gating = Gating(self.state, self.store, self.pending_job)  # dependencies, arrays, job references
        self.access = Access(self.state, self.store, self.gating.expand_refs)  # shared.py: who may do what
        self.commits = StoreRetry(self.store, self._clock, self.log)  # the store-commit retry state
        self.trouble = HostTrouble(self._clock, self.log, partial(replan, self.state))  # hosts in trouble
        self.fault_record = FaultRecord(home, self.log)  # why the previous run stopped, if on a fault
        self._hostops = seams.hostops_factory(self._events)  # signals run on a worker per host, never on the tick
        state = self.state
        self.kills = KillMarks(self._hostops, self._clock, self.trouble, state.mu, state.wake.set,
                               state.active, state.hosts, state.generation)  # kill delivery (kill_marks.py)
        self.leases = HostLeases(self.store, self._clock, self.log, lambda: self.state.config.controller)
        self.launches = TaskLaunches(self.state, self._hostops, self.log)  # `xce launch` (task_launches.py)
        self.faults = Faults(self.state, self.commits, self.trouble, self.fault_record, self.kills, self.launches,
                             self.access, self.log)  # faults.py
        self.projects = ProjectShares(self.state, self.store, self._clock, self.log,
                                      lambda moves, verb, why: self.actions.move_pending(moves, verb, why))
        self.units = Units(state, self.store, self._clock, self.log, self._events, self._hostops, self.kills,
                           self.leases, self.launches, self.faults)  # what runs where (unitwork.py)
        self.prefill = Prefill(state, self.projects, self.units, self.log, seams.prefill)  # queued successors
        self.pools = Pools(state, self.pool_records, self.pool_views, self.store, home, self._clock, self.log,
                           self._events, self._hosts_now, self.units.unit_finished, self.units.end_job)
        self.units.hold_end = self.pools.ends.hold  # an end Slurm may explain waits for its word (pool_ends.py)
        self.dispatching = Dispatching(state, self.store, self._clock, self.log, self.gating, self.projects,
                                       self.metrics, self.units.end_active, self.units.add_active,
                                       self.units.launch_later)  # plans, reasons, apply
        self.links = HostLinks(state, seams, home, self._clock, self.log, self._events)  # links.py
        self.config_api = ConfigRoutes(state, self.store, home, self._clock, self.log, self.pool_views, self.gating,
                                       self.projects, self.links.hosts_changed)  # the configuration's routes, reconfig
        self.metrics_api = MetricsRoutes(self.state, self.store, self._clock, self.metrics, self.gating.gate,
                                         self._hosts_now)  # metrics: its routes
        # the API's routes (the server's threads): each turns a request into calls on the parts
        self.submitting = Submitting(state, self.store, self._clock, self.metrics, self.gating, self.projects,
                                     self.pool_views, self.access)
        self.actions = JobActions(state, self.store, self._clock, self.metrics, self.gating, self.projects,
                                  self.access, self.kills, self.trouble)
        self.views = JobViews(state, self.store, home, self.started_at, self.gating, self.projects, self.pool_views,
                              self.faults, self.access, self.trouble, self._hosts_now, self._shared_free, self.stop,
                              lambda: self._server.stats() if self._server is not None else None)
        self.flows = FlowRoutes(state, self.store, self._clock, self.metrics, self.gating, self.submitting)
        self._hosts_view = HostViews()  # what each host has free, rebuilt for the hosts that changed
        self._scheduler = seams.scheduler_factory()
        self._server: ApiServer | None = None
        self._retention = Retention(self.log, self.state.wake.set)  # step 8 of the tick
        self._failed = False  # stopped on a fault (faults.py): its record stays for the next start

    def routes(self) -> dict[tuple[str, str], Handler]:
        """Every route behind the permission rules (shared.py: who may act on which job, what others
        see of a job) and the store's refusal."""
        table = {**self.views.routes(), **self.submitting.routes(), **self.actions.routes(),
                 **self.config_api.routes(), **self.flows.routes(), **self.metrics_api.routes(),
                 **self.projects.routes()}
        return {route: store_refusal(self.access.permitted(route, handler)) for route, handler in table.items()}

    # the handlers the simulator calls by name (sim/controlled.py)
    def api_submit(self, caller: Caller, query: dict, body: Any) -> dict:
        return self.submitting.api_submit(caller, query, body)

    def api_kill(self, caller: Caller, query: dict, body: Any) -> dict:
        return self.actions.api_kill(caller, query, body)

    def api_hold(self, caller: Caller, query: dict, body: Any) -> dict:
        return self.actions.api_hold(caller, query, body)

    def api_release(self, caller: Caller, query: dict, body: Any) -> dict:
        return self.actions.api_release(caller, query, body)

    # ---- running ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until stopped: load, start the host links, serve the API, tick."""
        try:
            self._load()
            self.projects.hold_outside(self.store.unfinished())  # the configuration may have changed while stopped
            for host_config in self.state.config.hosts:
                self._start_link(host_config)
            self.links.settle_local(lambda: self.tick(self._clock.time()), self._stopping)
            mode, group = socket_mode(self.state.config)  # shared.py: 0600, or open to the lab's users
            self._server = ApiServer(self.home.socket, self.routes(), self.log, mode=mode, group=group,
                                     settle=self.store.settle_reads)  # no reply tells what is not on disk
            threading.Thread(target=self._server.serve_forever, name="api", daemon=True).start()
            self.log(f"controller for cluster {self.state.cluster!r} serving at {self.home.socket}")
            if self.fault_record.previous is not None:
                self.log(f"note: the previous run stopped on a fault: {self.fault_record.previous['why']}")
            while not self._stopping.is_set():
                retry = self.commits.wait()
                wait = self.units.starts.sleep(min(self.state.config.controller.tick, self.leases.wait()), self.units)
                woken = self._sleep(wait if retry is None else min(wait, retry + 0.01), deferrable=retry is None)
                if not self._stopping.is_set():
                    try:
                        self.tick(self._clock.time(), quiet=not woken)
                    except errors.StoreUnavailable as err:  # a read the store refused: the next tick tries again
                        self.quiet_ends.abandon()  # the ends it would have decided at its end wake the next
                        self.log(f"tick skipped: {err}")
        except Exception as err:  # unsafe to go on: say why (faults.py); faults that are not are handled within
            self.fault_record.fatal(err)
            self._failed = True
            raise errors.XceError(f"the controller stopped on a fault ({err.__class__.__name__}: {err}); "
                                  f"its log says why, and `xce controller status` shows it") from err
        finally:
            self._shutdown()

    def _sleep(self, wait: float, deferrable: bool) -> bool:
        """Sleep `wait` s at most (sleeping.py); True if the next tick is not quiet."""
        return sleeping.sleep(self.state, self._clock, wait, deferrable, self.dispatching.quiet_wait(), self.quiet_ends)

    def _connected(self) -> dict:
        """The connected hosts' handles, as of now."""
        with self.state.mu:
            return dict(self.state.hosts)

    def _renew_leases(self) -> None:
        self.leases.renew(self._connected())

    def stop(self) -> None:
        self._stopping.set()
        self.state.wake.set()

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.home.socket.unlink(missing_ok=True)
        if self._stopping.is_set():  # a planned stop: the jobs may go on for the maintenance lease
            self.leases.grant_maintenance(self._connected())
        for link in self.state.links.values():
            link.close()  # the agents exit (or stay for the lease); the jobs go on under their supervisors
        self._scheduler.close()
        self._hostops.close()
        self.store.close()
        if not self._failed:
            self.fault_record.clear()
        self.log("controller stopped")

    def _load(self) -> None:
        """Rebuild the shared state from the store (recovery.py)."""
        load(self.state, self.store, self._clock, self.log, self.gating, self.dispatching, self.units, self.kills)

    def _start_link(self, host: HostConfig) -> None:
        """Keep `host` connected from now on (links.py); until it answers it is unreachable."""
        self.links.start(host)

    # ---- the tick ---------------------------------------------------------------------------

    def tick(self, now: float, quiet: bool = False) -> None:
        """One pass at wall time `now`; see the module docstring. Everything learned and decided in
        it is stored in one durable commit, before any launch; launch replies are stored by the next
        pass. A store that cannot take the commit (busy, full) loses nothing: faults.py puts it all
        back. `quiet`: nothing woke it and no submit waits (sleeping.py): the reasons held back are stored now."""
        began = time.monotonic()  # metrics:
        self.quiet_ends.taken(self.units.starts)  # (before the queue is read: one that comes after bounds the next)
        self.units.collect(now)
        self.units.expire_lost_hosts(now)
        if not self.commits.due():
            self.quiet_ends.publish(urgent=True)
            self.kills.deliver()  # recorded before: they need no commit of this tick
            self._renew_leases()  # nor do the leases: a store that refuses commits must not stop the jobs
            return
        self.pools.step(now)
        cancels = self.gating.step()
        with self.state.mu:
            finishing, self.state.unrecorded = self.state.unrecorded, []
            started, self.state.unrecorded_started = self.state.unrecorded_started, []
            requeues = kill_wins(self.state.active, self.state.unrecorded_requeues, finishing, now)
            self.state.unrecorded_requeues = []
            events, self.state.host_hook_events = self.state.host_hook_events, []
            closing = {f.job_id for f, _event in finishing} | {r.job_id for r in requeues}
            dirty, self.state.dirty = self.state.dirty or bool(closing), False
            closing |= self.prefill.hidden(closing)  # queued successors hold nothing beside their predecessors
            hosts = self._hosts_now(closing) if dirty and (self.state.pending or self.state.behind) else None
            shared = self._shared_free(closing) if hosts is not None else None
            if dirty:
                submit_wake.taken(self.state, hosts)  # a submit wakes the tick again unless these are full
        reasons: dict[int, str | None] = {}
        self.commits.in_commit = len(finishing) + len(started) + len(requeues) + len(events)
        try:
            session = self._schedule(hosts, shared, now, closing) if hosts is not None and self.state.pending else None
            decisions = self.prefill.extend(self.pool_views.reasons(session), hosts, shared, now, closing)
            plans = self.dispatching.plans(decisions) if decisions is not None else []
            reasons = self.dispatching.reasons_to_store(decisions, now, quiet)
            others = bool(plans or reasons or requeues or cancels or events)  # ends may wait (start_wait.py), unless:
            urgent = len(self.gating.gate) > 0 or self.commits.problem is not None or not self.seams.end_waits
            finishing, started = self.units.starts.waiting(finishing, started, others, now, self.state, urgent)
            writes = TickWrites(now, finishing, started, plans, reasons, requeues, cancels, events)
            record = self.store.record_tick(writes) if writes else None
            if not writes and self.commits.problem is not None:
                self.store.set_meta("write_probe", str(now))  # does the store take writes again?
        except errors.StoreUnavailable as err:
            with self.state.mu:  # the session's reasons may not have been taken in: all again next time
                self.state.pending.report_reasons_again()
            self.commits.in_commit = 0
            self.faults.commit_failed(err, (finishing, started, requeues, events, reasons))
            self.quiet_ends.publish(urgent=True)
            self.kills.deliver()
            self._renew_leases()  # a busy or full store must not make the hosts stop their jobs
            return
        self.commits.in_commit = 0
        self.commits.done()
        if record is not None:
            self.dispatching.apply(record, finishing, requeues, plans)
        self._renew_leases()  # before any launch: on each host's channel a launch follows a grant
        self.units.act()
        with self.state.mu:
            self.quiet_ends.publish(urgent)  # which ends and starts need no tick until the next (quiet_ends.py)
        busy = bool(finishing or started or plans or requeues or cancels)
        self._retention.step(self.store, self.state.config.controller, now, busy)
        if self.units.starts.news(self.state) or self.state.unrecorded_requeues:  # (what waits: start_wait.py)
            self.state.wake.set()  # store launch outcomes at once (with whatever else came meanwhile)
        self.metrics.observe("tick", time.monotonic() - began)  # metrics:

    def _hold_outside_projects(self, jobs: list[Job]) -> list[int]:
        """At a start (serve, the simulator's): pending jobs the configuration put outside their project are held."""
        return self.projects.hold_outside(jobs)

    def pending_job(self, job_id: int, user: str, queue: str, spec: JobSpec, submit_time: float) -> PendingJob:
        """The scheduler's view of a pending job (snapshot.pending_job, which the simulator shares)."""
        return self.pool_views.with_pool_time(
            *pending_job(job_id, user, queue, spec, submit_time, self.state.config, self.state.profiles))

    def _hosts_now(self, closing: AbstractSet[int] = frozenset()) -> tuple[HostView, ...]:
        """What is free on each host; of jobs in `closing` (ending in this tick) only the units that
        still run hold anything (they drain: stopped, holding their resources until they end)."""
        draining = ((d.job_id, d.alloc) for d in self.state.draining.values())
        closing = closing | self.prefill.hidden(closing)  # prefilling.py: no double booking
        allocs = self.state.active.allocs_by_host(closing, _still_runs, draining)  # kept as jobs come and go
        return self._hosts_view.of(self.state.host_totals, self.faults.scheduler_states(), allocs)

    def _shared_free(self, closing: AbstractSet[int] = frozenset()) -> FrozenMap:
        return self.state.active.shared_free(self.state.config.shared, closing)

    def _schedule(self, hosts: tuple[HostView, ...], shared, now: float,
                  closing: AbstractSet[int] = frozenset()) -> Decisions | None:
        """One session (inline or in the worker: sched_switch.py), fed with what changed in the pending set; `closing`:
        jobs ending in this tick, which hold nothing in it, as in the host views (queue and project
        limits, fair share's running slots; fair share still counts their use)."""
        try:
            with self.state.mu:  # the pending set's changes are taken under the lock; the wait is not
                running = self.state.active.running(closing)  # summed per (queue, user), kept as jobs come and go
                base = Snapshot(hosts, (), self.state.queue_policies, shared, running, now,
                                self.state.config.controller.reserve_after, **self.projects.inputs(now, closing))
                if self.state.config.pools:  # pool_views words the reasons of a pool's jobs anew
                    self.state.pending.report_reasons_again(self.pool_views.reworded(self.state.pending.values()))
                sent = time.monotonic()  # metrics:
                self._scheduler.send(self.state.pending, base, self.state.config.controller.sched_budget)
            decisions = self._scheduler.receive()
            self.metrics.observe("session", time.monotonic() - sent)  # metrics:
        except TimeoutError as err:
            self.log(f"{err}; it will be restarted")
            decisions = None
        if decisions is None:  # out of step or restarted: the next session sends the whole set
            self.state.dirty = True
            self.state.wake.set()
        return decisions


def _still_runs(job: Active, index: int) -> bool:
    """Of a job ending in this tick, whether its unit `index` may still run (it holds its share)."""
    return job.status[index] in (SENT, RUNNING) and not job.queued  # a queued one holds its predecessor's


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} {message}", file=sys.stderr, flush=True)
