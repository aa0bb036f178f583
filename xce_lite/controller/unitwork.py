"""The controller's side of the units on its hosts: what each active job's units are doing, what the
hosts report about them, launching, stopping and forgetting them, and hosts coming and going.

A part of the controller (`Controller.units`), given the shared state, the store, the clock, the log,
the controller's event queue, the hosts' workers, the kills, the leases, the task launches and the
faults' part. Everything here that touches the shared state runs under its lock; round trips to a
host (launch, forget) run outside it, from the tick's `act` step, and signals (stops, kills) on
the host's own worker (hostops.py), whose outcomes come back as events.

Per unit of an active job, a status: NEW (not sent to its host yet, or not known to be there),
SENT (a launch is on its way), RUNNING (its host said so), ENDED (its result is in `results`).
A job's outcome is unit 0's result. When a job ends or is requeued, its units that may still run
"drain": they are asked to stop and keep their resources (in the state's `draining`) until their host
reports them ended, so no new job is placed on what they still use. A unit nobody expects that
runs on a host (a copy from before its host was declared lost) is stopped; one that ended is
forgotten. Draining lives in memory only: after a controller restart such units are stale copies,
stopped when their host lists them.
"""

from __future__ import annotations

import contextlib
import queue
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

from xce_lite import errors
from xce_lite.config.sched_view import Holding
from xce_lite.controller.faults import Faults
from xce_lite.controller.hostops import CallDone, HostAnswers, SignalDone
from xce_lite.controller.jobunits import Expected, UnitLaunch, failed_pre_hook, launch_requests, reconcile
from xce_lite.controller.kill_marks import KillMarks
from xce_lite.controller.kills import killed_reason, on_lost
from xce_lite.controller.leasework import HostLeases
from xce_lite.controller.outcomes import finish_from_result, retry_of
from xce_lite.controller.seams import Clock
from xce_lite.controller.start_wait import StartWaits, quiet_launch  # noqa: F401 (its home was here)
from xce_lite.controller.state import ENDED, NEW, RUNNING, SENT, Active, ControllerState, Draining
from xce_lite.controller.task_launches import TaskLaunches
from xce_lite.exec.host import JobResult, LaunchRequest, LaunchRequested, TaskFinished, UnitFinished, UnitsLaunched
from xce_lite.exec.link import HostDown, HostUp
from xce_lite.models import DISP, EXIT, RUN
from xce_lite.quantities import format_duration
from xce_lite.sched.core import HOST_OK
from xce_lite.store.jobs import Finish, Requeue

UNREACH = "unreachable"


class Units:
    """See the module docstring."""

    def __init__(self, state: ControllerState, store: Any, clock: Clock, log: Callable[[str], None],
                 events: queue.Queue, hostops: Any, kills: KillMarks, leases: HostLeases, launches: TaskLaunches,
                 faults: Faults) -> None:
        self.state, self.store, self.clock, self.log, self.events = state, store, clock, log, events
        self.hostops, self.kills, self.leases, self.launches, self.faults = hostops, kills, leases, launches, faults
        self.to_launch: list[str] = []  # units to send to their hosts
        self.hold_end: Callable[[str, str, Active, JobResult, float], bool] = lambda *_: False  # pool_ends.py
        self.stops: list[tuple[str, str, str]] = []  # (host, unit, reason) to signal TERM
        self.forgets: dict[str, list[str]] = defaultdict(list)  # host -> units it may drop
        # launches sent whose replies are not collected yet: while any are, `serve` sleeps START_WAIT at
        # most, since replies that only say the units run do not wake the tick (quiet_launch)
        self.replies_due: dict[str, int] = {}  # per host: launches sent, not answered yet
        self.starts = StartWaits(clock)  # starts that wait for a commit to join: the tick's (start_wait.py)
        # queued successors (prefilling.py sets both): a host's word that one left its queue, and a
        # launch request with the unit it follows
        self.on_unqueued: Callable[[Any, float], None] = lambda _event, _now: None
        self.request_of: Callable[[Active, LaunchRequest], LaunchRequest] = lambda _job, request: request

    def launch_later(self, units: tuple[str, ...]) -> None:
        """Dispatched units, sent to their hosts by the next `act`. Holds the lock."""
        self.to_launch.extend(units)

    def add_active(self, job: Active) -> None:
        self.state.active[job.id] = job
        for index, unit in enumerate(job.units):
            self.state.by_unit[unit] = (job.id, index)

    def holdings(self, closing: AbstractSet[int]) -> list[Holding]:
        """What active and draining units hold; of a job in `closing`, only its units still running."""
        held = []
        for job in self.state.active.values():
            if job.id not in closing:
                held.append(job.holding)
            else:
                live = tuple(a for i, a in enumerate(job.holding.allocs) if job.status[i] in (SENT, RUNNING))
                if live:
                    held.append(Holding(live))
        held.extend(Holding((d.alloc,)) for d in self.state.draining.values())
        return held

    # ---- 1. collect -------------------------------------------------------------------------

    def collect(self, now: float) -> None:
        """Drain host events into the in-memory view; what must be stored waits in _unrecorded*."""
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            with self.state.mu:
                if isinstance(event, UnitFinished):
                    self.unit_finished(event.host, event.unit, event.result, now)
                elif isinstance(event, UnitsLaunched):
                    self._answered(event.host)
                    self._launched(event, now)
                elif isinstance(event, HostUp):
                    self._host_up(event, now)
                elif isinstance(event, HostDown):
                    self._host_down(event, now)
                elif isinstance(event, LaunchRequested):
                    self.launches.requested(event)
                elif isinstance(event, TaskFinished):
                    self.launches.finished(event)
                elif isinstance(event, SignalDone):
                    self.faults.signal_done(event)
                elif isinstance(event, HostAnswers):
                    self.faults.host_answers(event)
                elif isinstance(event, CallDone):
                    self.faults.call_done(event)
                else:  # UnitUnqueued (exec/host.py)
                    self.on_unqueued(event, now)

    def unit_finished(self, host: str, unit: str, result: JobResult, now: float) -> None:
        """A unit ended (the result is durable on its host until we forget it)."""
        drain = self.state.draining.pop(unit, None)
        if drain is not None:
            if result.hooks:  # a host the job ended before: what its host hooks did is the job's too
                self.state.host_hook_events.append((drain.job_id, "host_hooks", {
                    "host": host, "unit": unit, "hooks": list(result.hooks), "note": result.note}))
            self.forgets[host].append(unit)
            self.state.dirty = True  # what it held is free
            return
        job, index = self._unit(unit)
        if job is None:
            self.forgets[host].append(unit)  # recorded already (a repeated event, or a stale copy's)
            return
        if job.status[index] == ENDED or (not job.ending and self.hold_end(host, unit, job, result, now)):
            return  # a repeated event (adoption, relaunch), or one that waits for Slurm's word (pool_ends.py)
        job.status[index] = ENDED
        job.results[index] = result
        self.launches.unit_tasks_ended(job.id, index)
        if index == 0 and not job.ending:
            job.ending = True
            finish = finish_from_result(job, result)
            retry = self.leases.requeue_after_expiry(job, host, result) or retry_of(job, finish)
            if retry is not None:
                self.state.unrecorded_requeues.append(retry)
            else:
                self.state.unrecorded.append((finish, "finished"))
        elif index != 0 and not job.ending and (failed := failed_pre_hook(result)) is not None:
            # the job's other host could not get ready: end the job (a kill, delivered as kills
            # that race a launch are), with the hook's failure as its reason
            self.kills.mark_once(job.id, f"{failed} on host {host}")

    def _launched(self, event: UnitsLaunched, now: float) -> None:
        """A host's replies to a launch: running units, and refusals that end their job."""
        for reply in event.replies:
            job, index = self._unit(reply.unit)
            if job is None or job.status[index] not in (NEW, SENT):
                continue
            if reply.status == "refused":
                why = f"launch refused by host {event.host}: {reply.error}"
                self.end_job(job, EXIT, killed_reason(job.killed, why), "launch_failed", now)
            elif reply.status in ("started", "running"):
                self._mark_running(job, index, reply.start_time or now)
            # "finished": an adopted unit that already ended; its finished event follows
        for unit in event.failed:
            job, index = self._unit(unit)
            if job is not None and job.status[index] in (NEW, SENT):
                self.end_job(job, EXIT, killed_reason(job.killed, f"launch failed on host {event.host}: {event.error}"),
                             "launch_failed", now)

    def _unit(self, unit: str) -> tuple[Active | None, int]:
        where = self.state.by_unit.get(unit)
        if where is None:
            return None, -1
        return self.state.active.get(where[0]), where[1]

    def _mark_running(self, job: Active, index: int, start_time: float) -> None:
        """The unit runs: the job is RUN in memory once its first unit runs, in the store with the
        next commit."""
        job.status[index] = RUNNING
        if index == 0 and job.state == DISP and not job.ending:
            job.state = RUN
            self.state.unrecorded_started.append((job.id, start_time))

    def end_job(self, job: Active, state: str, reason: str, event: str, now: float) -> None:
        """End an active job now, with no result from its first unit (refused, lost, vanished); a
        killed job's `reason` is the caller's to word (kills.killed_reason)."""
        if job.ending:
            return
        job.ending = True
        start = None if job.state == DISP else now
        self.state.unrecorded.append((Finish(job.id, job.state, state, start, now, None, None, None, None, reason),
                                 event))

    def _host_up(self, up: HostUp, now: float) -> None:
        """A host's agent answers: match what it lists with what we expect there."""
        name = up.host
        self.faults.host_reset(name)  # kills in flight on the old connection go again on this one
        self.state.hosts[name] = up.handle
        self.state.host_state[name] = HOST_OK
        self.state.generation[name] = up.generation
        self.state.probes[name] = up.probe
        was_lost = name in self.state.lost_hosts
        since = self.state.down_since.pop(name, None)
        self.state.down_why.pop(name, None)
        self.state.lost_hosts.discard(name)
        self.leases.host_up(name, up.probe)
        self.state.dirty = True
        if since is not None and now - since > 5:
            self.log(f"host {name}: back after {format_duration(now - since)}"
                     + (" (its jobs were handled as lost)" if was_lost else ""))
        expected: dict[str, Expected] = {}
        for active in self.state.active.values():
            for index, unit in enumerate(active.units):
                if active.host_of(index) == name and active.status[index] != ENDED:
                    expected[unit] = Expected(active.id, index, started=active.status[index] == RUNNING)
        for unit, drain in self.state.draining.items():
            if drain.host == name:
                expected[unit] = Expected(drain.job_id, -1, started=True, draining=True)
        seen = reconcile(up.units, expected)
        for unit, result in seen.finished:
            self.unit_finished(name, unit, result, now)
        for unit, start_time in seen.running:
            job, index = self._unit(unit)
            if job is not None:
                self._mark_running(job, index, start_time or now)
        for unit in seen.to_launch:
            job, index = self._unit(unit)
            if job is not None and not job.ending:
                job.status[index] = NEW
                self.to_launch.append(unit)
        for unit in seen.vanished:
            job, _index = self._unit(unit)
            if job is not None:
                self.end_job(job, EXIT, killed_reason(job.killed, f"lost: unit {unit} vanished from host {name}"),
                             "lost", now)
        for unit in seen.stale:
            self.stops.append((name, unit, "stale copy: its job ended or was requeued meanwhile"))
        for unit in seen.gone:
            self.state.draining.pop(unit, None)
        self.forgets[name].extend(seen.forget)
        self.log(f"host {name}: agent up ({up.probe.cpus} cpus, {len(up.units)} units listed"
                 + (f", {len(seen.stale)} stale stopped" if seen.stale else "") + ")")

    def _answered(self, host: str) -> None:
        if (left := self.replies_due.pop(host, 0) - 1) > 0:
            self.replies_due[host] = left

    def _host_down(self, down: HostDown, now: float) -> None:
        if down.generation < self.state.generation.get(down.host, 0):
            return  # about a connection older than the one that is up
        name = down.host
        self.replies_due.pop(name, None)  # its launches lost with it are never answered; other hosts' still are
        if self.state.host_state.get(name) == HOST_OK:
            self.log(f"host {name}: agent lost ({down.why}); reconnecting")
        elif self.state.down_why.get(name) != down.why:
            self.log(f"host {name} is unreachable: {down.why}")
        self.state.down_why[name] = down.why
        self.state.host_state[name] = UNREACH
        self.faults.host_reset(name)
        self.state.hosts.pop(name, None)  # the link closes it
        self.state.down_since.setdefault(name, now)
        self.leases.host_down(name)
        self.state.dirty = True

    # ---- 2. hosts lost ----------------------------------------------------------------------

    def expire_lost_hosts(self, now: float) -> None:
        """A host out of reach for the grace period is lost: its jobs are requeued (or end EXIT).
        Never before the lease it may hold has surely run out, nor before `host_lost_after` has
        passed since this controller started (leasework.py): by then it has stopped them itself."""
        grace = self.state.config.controller.host_lost_after
        with self.state.mu:
            for name, since in self.state.down_since.items():
                if name in self.state.lost_hosts or now - since < grace or not self.leases.allows_loss(name):
                    continue
                self.state.lost_hosts.add(name)
                victims = [j for j in self.state.active.values()
                           if not j.ending and any(a.host == name for a in j.holding.allocs)]
                why = f"host {name} lost: no agent for {format_duration(now - since)}"
                self.log(f"{why}; {len(victims)} job(s) {self.state.config.controller.on_host_lost}")
                for job in victims:
                    outcome = on_lost(job, why, self.state.config.controller.on_host_lost)  # kill wins (kills.py)
                    if isinstance(outcome, Requeue):
                        job.ending = True
                        self.state.unrecorded_requeues.append(outcome)
                    else:
                        if job.killed:
                            self.kills.forget(job.id)
                        self.end_job(job, EXIT, outcome, "lost", now)

    # ---- 6. act -----------------------------------------------------------------------------

    def end_active(self, job_id: int, why: str) -> None:
        """The job's end (or requeue) is stored: forget its ended units, drain the others. Holds _mu."""
        job = self.state.active.pop(job_id, None)
        self.kills.forget(job_id)
        if job is None:
            return
        self.launches.unit_tasks_ended(job_id)
        for index, unit in enumerate(job.units):
            self.state.by_unit.pop(unit, None)
            host = job.host_of(index)
            if job.status[index] == ENDED:
                self.forgets[host].append(unit)
            elif job.status[index] in (SENT, RUNNING) or host not in self.state.hosts:
                # may run (a unit on a host out of reach is not known not to): it holds its share
                # until its host says it ended, or no longer lists it
                self.state.draining[unit] = Draining(job_id, job.holding.allocs[index])
                self.stops.append((host, unit, why))
        if any(u in job.units for u in self.to_launch):
            self.to_launch = [u for u in self.to_launch if u not in job.units]

    def act(self) -> None:
        """After the commit: launch, forget, stop, deliver kills (round trips, outside the lock). A
        launch never names a unit forgotten here (a new attempt has new unit names), so the order
        is free: launches go first, the latency that matters."""
        with self.state.mu:
            forgets, self.forgets = self.forgets, defaultdict(list)
            stops, self.stops = self.stops, []
            launch, self.to_launch = self.to_launch, []
        with contextlib.ExitStack() as corks:
            if launch:  # a host's forgets join its launch in one write: one wake-up of its agent (Host.corked)
                for host in filter(None, map(self.state.hosts.get, forgets)):
                    corks.enter_context(host.corked())
                self._launch(launch)  # first: a freed slot's next job is on its way before the rest is written
            for name, units in forgets.items():
                host = self.state.hosts.get(name)
                if host is not None and units:
                    with contextlib.suppress(errors.HostUnreachable):  # not dropped now: forgotten after a reconnect
                        host.forget(units, wait=False)
        for name, unit, reason in stops:  # a host out of reach: stopped when it lists the unit again
            if (host := self.state.hosts.get(name)) is not None:  # on its worker (hostops.py): holds up no tick
                self.hostops.signal(name, self.state.generation.get(name, 0), host, unit, "TERM", reason)
        self.launches.send()
        if self.kills:
            self.kills.deliver()

    def _launch(self, units: list[str]) -> None:
        """Send each unit to its host (one batch per host); a host out of reach gets them when it
        lists its units again."""
        with self.state.mu:
            wanted = [(self.state.by_unit[u], u) for u in units if u in self.state.by_unit]
            # a job dispatched by this run carries its row from the plan; one loaded at a restart does not
            given = {job_id: job.launch_with for (job_id, _i), _u in wanted
                     if (job := self.state.active.get(job_id)) is not None and job.launch_with is not None}
        job_ids = list(dict.fromkeys(job_id for (job_id, _i), _u in wanted if job_id not in given))
        stored = {job.id: job for job in self.store.jobs(job_ids)} if job_ids else {}
        by_host: dict[str, list] = defaultdict(list)
        made: dict[int, list[UnitLaunch]] = {}  # a job's launches, made once for all its units
        now = self.clock.time()
        with self.state.mu:
            for (job_id, index), _unit in wanted:
                job, carried = self.state.active.get(job_id), given.get(job_id)
                row = carried.row if carried is not None else stored.get(job_id)
                # a carried row is as its dispatch stored it: the job's state since is the active one's
                state = job.state if carried is not None and job is not None else row.state if row else None
                if job is None or row is None or job.ending or state not in (DISP, RUN) or not row.hosts:
                    continue
                kill_reason = self.kills.get(job_id)
                if kill_reason is not None and job.state == DISP:
                    self.kills.forget(job_id)  # killed before it reached its host: it never starts
                    self.end_job(job, EXIT, kill_reason + " before it started", "launch_failed", now)
                    continue
                if job.killed:
                    continue  # killed while it runs: no more of it starts (a unit whose launch got lost)
                if job_id not in made:
                    queue = self.state.config.queue(row.queue)
                    made[job_id] = launch_requests(
                        self.state.cluster, row, self.state.config.controller.grace,
                        row.spec.run_limit or queue.run_limit, row.spec.mem_limit or queue.mem_limit,
                        self.state.addresses, carried.effective if carried is not None else None,
                        carried.holding if carried is not None else None)
                launch = made[job_id][index]
                if launch.host not in self.state.hosts:
                    continue  # sent when its host lists its units again
                job.status[index] = SENT
                by_host[launch.host].append(self.request_of(job, launch.request))
        for name, requests in by_host.items():
            host = self.state.hosts.get(name)
            try:
                if host is None:
                    raise errors.HostUnreachable(f"host {name} is not connected")
                host.launch_nowait(requests)  # replies come back as an UnitsLaunched event
                self.replies_due[name] = self.replies_due.get(name, 0) + 1
            except errors.HostUnreachable as err:
                self.log(f"host {name}: launch failed, will retry when it is back: {err}")
                with self.state.mu:
                    for request in requests:
                        job, index = self._unit(request.unit)
                        if job is not None and job.status[index] == SENT:
                            job.status[index] = NEW

