"""A simulation by the controller's own tick: the workload submitted through the API's handler to the
real `Controller` (sim/controlled.py) on fake hosts and a fake clock, event by event.

So retries, host loss (the workload's `hosts:` events), multi-host units, dependencies, arrays,
projects and every policy the controller has are simulated by the code that runs them for real:
nothing of the tick is copied here. What this module adds: when the next instant is, what is due
then, and reading the outcome back from the controller's store.

An instant happens at the next submit, the next unit end, the next host event, or one tick
(`interval`) after an instant at which the controller asked to be woken (a launch reply to record,
a session cut short, a host out of reach whose loss is still to come); instants lie on the grid of
`interval` seconds, as in the older engine. At an instant, in order: the fake hosts end what is due
(their reports reach the controller's queue), host events happen, jobs due are submitted (a job the
controller refuses is "rejected", with its message), then the controller ticks once.

Times in the workload and the summary are seconds from the simulation's start; the controller sees
`START` + those. The store is a throwaway file (no fsync: `durable=False`) in a temporary home.
Deterministic: the same config and workload give the same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from xce_lite.config.profiles import applications_path
from xce_lite.controller.sched_worker import InlineScheduler
from xce_lite.errors import SpecError
from xce_lite.exec.fake import sim_argv
from xce_lite.models import JobSpec
from xce_lite.sim.controlled import Controlled
from xce_lite.sim.workload import Workload, WorkloadJob
from xce_lite.store.jobs import JobStore, TickWrites
from xce_lite.workflow.arrays import ArraySpec

START = 1_700_000_000.0  # what the controller's clock reads at the simulation's second 0


class _Counting(InlineScheduler):
    """The controller's in-process scheduler, counting its sessions for the summary."""

    def __init__(self, sim: TickSimulation) -> None:
        super().__init__()
        self._sim = sim

    def receive(self):
        decisions = super().receive()
        if decisions is not None:
            self._sim.sessions += 1
        return decisions


@dataclass
class Outcome:
    """One job at the end (or where the run stopped), read from the controller's store."""

    id: int
    row: int
    name: str | None
    user: str
    queue: str
    state: str
    submit: float
    start: float | None
    end: float | None
    exit_code: int | None
    attempt: int
    hosts: tuple[tuple[str, int], ...]
    reason: str | None
    alloc: dict | None = field(default=None, repr=False)


class _RecordingStore(JobStore):
    """The controller's store, keeping what each tick wrote: the simulation's record of decisions."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.writes: list[TickWrites] = []

    def record_tick(self, writes: TickWrites):
        self.writes.append(writes)
        return super().record_tick(writes)


class TickSimulation:
    def __init__(self, config_path: Path, workload: Workload, interval: float | None = None,
                 after_tick: Callable[[TickSimulation], None] | None = None) -> None:
        """`after_tick`: called after each of the controller's ticks (tests check its invariants)."""
        self.workload = workload
        self.after_tick = after_tick
        self.logs: list[str] = []
        self.sessions = 0
        self._root = Path(tempfile.mkdtemp(prefix="xce-sim-"))
        try:
            shutil.copyfile(config_path, self._root / "xce.yaml")
            apps = applications_path(config_path)
            if apps.exists():
                shutil.copyfile(apps, self._root / "applications.yaml")
            (self._root / "work").mkdir()
            self.run = Controlled(self._root, START, log=self._log, durable=False,
                                  scheduler_factory=lambda: _Counting(self), store_class=_RecordingStore)
        except BaseException:
            shutil.rmtree(self._root, ignore_errors=True)
            raise
        self.config = self.run.ctl.config
        tick = self.config.controller.tick
        self.interval = tick if interval is None else interval
        if self.interval < 0:
            raise SpecError(f"interval {self.interval}: give 0 (every instant) or a positive number of seconds")
        names = {h.name for h in self.config.hosts}
        for event in workload.hosts:
            if event.host not in names:
                self.close()
                raise SpecError(f"workload {workload.source}: host event for {event.host!r}, which the config does "
                                f"not have (its hosts: {', '.join(sorted(names))})")
        self._wake_after = self.interval or tick or 1.0
        self.entries = sorted(workload.jobs, key=lambda e: (e.submit, e.row))
        self._next = 0
        self._host_events = sorted([(e.lost, 0, e.host) for e in workload.hosts]
                                   + [(e.back, 1, e.host) for e in workload.hosts if e.back is not None])
        self._next_host_event = 0
        self.now = 0.0
        self.steps = self.sessions = 0
        self.rows: dict[int, int] = {}  # job id -> its workload row
        self.rejected: list[tuple[int, str]] = []  # (row, why)
        self._submitted: list[int] = []  # ids submitted at this instant
        self._rejected_now: list[tuple[int, str]] = []
        self.last: dict | None = None  # the last instant's record (step_json)

    def _log(self, message: str) -> None:
        self.logs.append(message)

    # ---- the clock

    def next_instant(self) -> float | None:
        """When the next instant is (seconds from the start); None when nothing is left to happen."""
        times = []
        if self._next < len(self.entries):
            times.append(self.entries[self._next].submit)
        end = self.run.cluster.next_end()
        if end is not None:
            times.append(end - START)
        if self._next_host_event < len(self._host_events):
            times.append(self._host_events[self._next_host_event][0])
        if self.run.wants_tick or self._loss_to_come():
            times.append(self.now + self._wake_after)
        if not times:
            return None
        t = max(min(times), self.now)
        if self.interval > 0:
            t = math.ceil(round(t / self.interval, 9)) * self.interval
        return max(t, self.now)

    def _loss_to_come(self) -> bool:
        """A host is out of reach and the controller has not yet declared it lost while it holds jobs."""
        ctl = self.run.ctl
        return any(name not in ctl._lost_hosts and any(a.host == name for j in ctl._active.values()
                                                       for a in j.holding.allocs)
                   for name in self.run.dropped)

    def step(self) -> bool:
        """Run one instant; False when the simulation is over."""
        t = self.next_instant()
        if t is None:
            return False
        self.now = t
        self.steps += 1
        clock = START + t
        self.run.cluster.advance(max(self.run.cluster.now, clock))  # what ended by now reports before a loss
        self.run.clock.now = clock
        while self._next_host_event < len(self._host_events) and self._host_events[self._next_host_event][0] <= t:
            _, kind, host = self._host_events[self._next_host_event]
            self._next_host_event += 1
            if kind == 0:
                self.run.drop(host)
            else:
                self.run.back(host)
        batch: list[WorkloadJob] = []
        while self._next < len(self.entries) and self.entries[self._next].submit <= t:
            entry = self.entries[self._next]
            self._next += 1
            if batch and (entry.user != batch[0].user or entry.after is not None):
                self._submit(batch)
                batch = []
            batch.append(entry)
            if entry.after is not None:  # it may name a job of the same instant: that one is stored first
                self._submit(batch)
                batch = []
        if batch:
            self._submit(batch)
        self.run.advance(clock)
        self.last = self._step_json()
        if self.after_tick is not None:
            self.after_tick(self)
        return True

    def _step_json(self) -> dict:
        """What this instant submitted, and what the controller's tick stored: every decision
        (dispatches with hosts and task counts, ends, requeues, cancels, changed pend reasons)."""
        store = self.run.ctl.store
        assert isinstance(store, _RecordingStore)  # the store this class gave the controller
        writes, store.writes = store.writes, []
        submitted, self._submitted = self._submitted, []
        rejected, self._rejected_now = self._rejected_now, []
        reasons: dict[str, list[int]] = {}
        for w in writes:
            for job_id, reason in sorted(w.reasons.items()):
                reasons.setdefault(reason or "", []).append(job_id)
        return {"step": self.steps, "t": round(self.now, 6), "submitted": submitted,
                "rejected": [list(r) for r in rejected],
                "dispatched": [[p.job_id, p.attempt, [list(h) for h in p.hosts]] for w in writes for p in w.plans],
                "finished": [[f.job_id, f.state, f.exit_code] for w in writes for f, _event in w.finishes],
                "requeued": [[r.job_id, r.reason] for w in writes for r in w.requeues],
                "cancelled": [[job_id, why] for w in writes for job_id, _state, why in w.cancels],
                "reasons": [[r, ids] for r, ids in reasons.items()]}

    def run_to_end(self, stop_at: float | None = None) -> None:
        while True:
            t = self.next_instant()
            if t is None or (stop_at is not None and t > stop_at):
                return
            self.step()

    def _submit(self, entries: list[WorkloadJob]) -> None:
        """One user's jobs due at one instant, in one request (one commit, ids in order); if the
        controller refuses the request, each job alone, so that only the wrong ones are rejected."""
        specs = [self._spec(e) for e in entries]
        if len(entries) > 1:
            try:
                ids = self.run.submit_specs(specs, entries[0].user)
            except SpecError:
                pass
            else:
                for entry, first in zip(entries, ids):
                    self._number(entry, first)
                self._submitted.extend(ids)
                return
        for entry, spec in zip(entries, specs):
            try:
                first = self.run.submit_spec(spec, entry.user)
            except SpecError as err:
                self.rejected.append((entry.row, str(err)))
                self._rejected_now.append((entry.row, str(err)))
                continue
            self._number(entry, first)
            self._submitted.append(first)

    def _number(self, entry: WorkloadJob, first: int) -> None:
        for i in range(len(entry.array[1]) if entry.array else 1):
            self.rows[first + i] = entry.row

    def _spec(self, entry: WorkloadJob) -> JobSpec:
        return JobSpec(argv=sim_argv(entry.runtime, entry.exit_code), cwd=str(self._root / "work"),
                       stdout=str(self._root / "work" / "out-%J"), name=entry.name, queue=entry.queue,
                       slots=entry.slots, max_slots=entry.max_slots, resreq=entry.resreq, run_limit=entry.run_limit,
                       mem_limit=entry.mem_limit, priority=entry.priority, app=entry.app, project=entry.project,
                       depend=entry.after, retry=entry.retry,
                       array=ArraySpec(entry.array[1], entry.array[2]).text() if entry.array else None)

    # ---- the outcome

    def outcomes(self) -> list[Outcome]:
        """Every submitted job as the controller stored it, by id."""
        found = []
        for job in self.run.ctl.store.jobs(include_finished=True):
            found.append(Outcome(
                job.id, self.rows.get(job.id, 0), job.name, job.user, job.queue, job.state, job.submit_time - START,
                None if job.start_time is None else job.start_time - START,
                None if job.end_time is None else job.end_time - START, job.exit_code, job.attempt,
                tuple(job.hosts), job.reason, job.alloc))
        return found

    def dispatch_order(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """(job, attempt, hosts) of every dispatch, in the order the controller recorded them."""
        order = []
        for outcome in self.outcomes():
            for seq, time, kind, data in self._events(outcome.id):
                if kind == "dispatched":
                    hosts = tuple(h[0] if isinstance(h, list) else h for h in (data or {}).get("hosts", ()))
                    order.append((time, seq, outcome.id, (data or {}).get("attempt", 0), hosts))
        return [(job, attempt, hosts) for _, _, job, attempt, hosts in sorted(order)]

    def _events(self, job_id: int) -> list[tuple[int, float, str, dict | None]]:
        return [(i, t, kind, data) for i, (t, kind, data) in enumerate(self.run.ctl.store.events(job_id))]

    def summary_json(self) -> dict:
        jobs = self.outcomes()
        states: dict[str, int] = {}
        for job in jobs:
            states[job.state] = states.get(job.state, 0) + 1
        if self.rejected:
            states["REJECTED"] = len(self.rejected)
        waiting = len(self.entries) - self._next
        if waiting:
            states["WAIT"] = waiting
        ends = [j.end for j in jobs if j.end is not None]
        submits = [j.submit for j in jobs]
        makespan = (max(ends) if ends else self.now) - (min(submits) if submits else 0.0)
        waits: dict[str, list[float]] = {}
        for job in jobs:
            if job.start is not None:
                waits.setdefault(job.queue, []).append(job.start - job.submit)
        totals: dict[str, float] = {}
        for view in self.run.ctl.host_totals:
            for name, amount in view.total.items():
                totals[name] = totals.get(name, 0) + amount
        used: dict[str, float] = dict.fromkeys(totals, 0.0)
        for job in jobs:  # the last attempt's use (an attempt requeued before is not counted)
            if job.start is None or job.alloc is None:
                continue
            span = (job.end if job.end is not None else self.now) - job.start
            for alloc in job.alloc.get("allocs", ()):
                for name, amount in (alloc[2] or {}).items():
                    if name in used:
                        used[name] += amount * span
        from xce_lite.sim.report import PERCENTILES, percentile

        return {
            "schema": 1, "engine": "tick", "jobs": len(jobs) + len(self.rejected) + waiting,
            "hosts": len(self.config.hosts), "steps": self.steps, "sessions": self.sessions, "clock": self.now,
            "states": states, "makespan": makespan,
            "retried": sum(j.attempt > 1 for j in jobs),
            "rejected": [{"row": row, "reason": why} for row, why in self.rejected],
            "wait": {queue: {"jobs": len(v), **{f"p{p}": percentile(sorted(v), p) for p in PERCENTILES},
                             "max": max(v)} for queue, v in sorted(waits.items())},
            "utilisation": {name: used[name] / (total * makespan)
                            for name, total in sorted(totals.items()) if total > 0 and makespan > 0},
            "host_events": [line for line in self.logs if " lost" in line],
        }

    def close(self) -> None:
        self.run.close()
        shutil.rmtree(self._root, ignore_errors=True)
