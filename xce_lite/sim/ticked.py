"""The simulation engine: the workload submitted through the API's handler to the real `Controller`
(sim/controlled.py) on fake hosts and a fake clock, and the controller's own tick run at each instant.

So retries, host loss (the workload's `hosts:` events), multi-host units, dependencies, arrays,
projects, fair share and every policy the controller has are simulated by the code that runs them for
real: nothing of the tick is copied here. What this module adds: when the next instant is, what is
due then, what each instant decided (a `Step`, read from what the tick wrote to its store), and the
outcome read back from the controller's store.

An instant happens at the next submit, the next unit end, the next host event, or one tick
(`interval`) after an instant at which the controller asked to be woken (a launch reply to record,
a session cut short, a host out of reach whose loss is still to come); instants lie on the grid of
`interval` seconds. At an instant, in order: the fake hosts end what is due (their reports reach the
controller's queue), host events happen, jobs due are submitted (a job the controller refuses is
"rejected", with its message), then the controller ticks once.

Tracing: `step(traced)` keeps the `core.Examined` values of the jobs `traced` names (the core's
observer, in this module's scheduler seam); they ride on the Step and are never recorded, so a trace
cannot change a decision. Snapshots (`state`, `restore`) replay: a state is where the run was (step,
clock) and a digest of every job's record there; `restore` runs a fresh simulation of the same inputs
to that step and checks the digest, so a run taken up from a snapshot goes on exactly as the whole.

Times in the workload and the summary are seconds from the simulation's start; the controller sees
`START` + those. The store is a throwaway file (no fsync: `durable=False`) in a temporary home.
Deterministic: the same config and workload give the same decisions.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from xce_lite.config.profiles import applications_path
from xce_lite.errors import SpecError
from xce_lite.sched.core import Decisions, SessionCache, Snapshot, schedule
from xce_lite.sim.controlled import Controlled
from xce_lite.sim.entry_specs import EntrySpecs
from xce_lite.sim.record import canonical
from xce_lite.sim.workload import Workload, WorkloadJob
from xce_lite.store.archive import Retained
from xce_lite.store.jobs import JobStore, TickWrites

START = 1_700_000_000.0  # what the controller's clock reads at the simulation's second 0


class _Scheduler:
    """The controller's scheduler seam in-process (as controller/sched_worker.InlineScheduler: the
    same `schedule` on the same snapshot), counting sessions and handing the simulation the
    `core.Examined` values of the jobs it traces. The observer only reads: decisions are the same."""

    def __init__(self, sim: TickSimulation) -> None:
        self._sim = sim
        self._cache = SessionCache()
        self._session: Snapshot | None = None
        self._budget = 0

    def send(self, pending, base: Snapshot, budget: int) -> None:
        pending.take_changes(False)  # the set is read whole: its changes are of no use here
        self._session, self._budget = replace(base, jobs=tuple(pending.values())), budget

    def receive(self) -> Decisions | None:
        session, self._session = self._session, None
        if session is None:
            return None
        self._sim.sessions += 1
        wants, seen = self._sim._traced, self._sim._examined
        observe = None if wants is None else (lambda e: seen.append(e) if wants(e.job_id) else None)
        return schedule(session, self._budget, observe, cache=self._cache)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Step:
    """What one instant did: what it submitted (ids) or rejected (workload row, why), and what the
    controller's tick stored: dispatches (job, attempt, ((host, tasks), ...))), ends (job, state,
    exit code), requeues (job, why), cancels (job, why), changed pend reasons (reason, ids); then
    the jobs pending and running after it."""

    number: int
    time: float
    session: int | None
    submitted: tuple[int, ...] = ()
    rejected: tuple[tuple[int, str], ...] = ()
    dispatched: tuple[tuple[int, int, tuple[tuple[str, int], ...]], ...] = ()
    finished: tuple[tuple[int, str, int | None], ...] = ()
    requeued: tuple[tuple[int, str | None], ...] = ()
    cancelled: tuple[tuple[int, str], ...] = ()
    reasons: tuple[tuple[str, tuple[int, ...]], ...] = ()
    pending: int = 0
    running: int = 0
    examined: tuple = field(default=(), compare=False)  # traced core.Examined values; never recorded

    def to_json(self) -> dict:
        """The recorded form: every decision and the counts, nothing the trace adds."""
        return {"step": self.number, "t": round(self.time, 6), "session": self.session,
                "submitted": list(self.submitted), "rejected": [list(r) for r in self.rejected],
                "dispatched": [[j, a, [list(h) for h in hosts]] for j, a, hosts in self.dispatched],
                "finished": [list(f) for f in self.finished], "requeued": [list(r) for r in self.requeued],
                "cancelled": [list(c) for c in self.cancelled], "reasons": [[r, list(ids)] for r, ids in self.reasons],
                "acct": {"pending": self.pending, "running": self.running}}


@dataclass
class Outcome:
    """One job at the end (or where the run stopped), read from the controller's store. `name`: an
    array element's is `name[index]`."""

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
    effective: dict | None = field(default=None, repr=False)
    array_id: int | None = None


class _RecordingStore(JobStore):
    """The controller's store, keeping what each tick wrote: the simulation's record of decisions.
    It archives nothing: a simulation longer than `keep_finished` still sums up every job (retention
    is what an operator keeps on disk, not a scheduling decision)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.writes: list[TickWrites] = []

    def record_tick(self, writes: TickWrites):
        self.writes.append(writes)
        return super().record_tick(writes)

    def retain(self, cutoff: float, batch: int) -> Retained:
        return Retained(0, 0, False)

    def prune_archive(self, cutoff: float, batch: int) -> int:
        return 0


class TickSimulation:
    def __init__(self, config_path: Path, workload: Workload, interval: float | None = None,
                 after_tick: Callable[[TickSimulation], None] | None = None) -> None:
        """`after_tick`: called after each of the controller's ticks (tests check its invariants)."""
        self.config_path, self.workload = Path(config_path), workload
        self.after_tick = after_tick
        self.logs: list[str] = []
        self.sessions = 0
        self._traced: Callable[[int], bool] | None = None  # which jobs' decisions the scheduler hands over
        self._examined: list = []
        self._root = Path(tempfile.mkdtemp(prefix="xce-sim-"))
        try:
            shutil.copyfile(config_path, self._root / "xce.yaml")
            apps = applications_path(config_path)
            if apps.exists():
                shutil.copyfile(apps, self._root / "applications.yaml")
            (self._root / "work").mkdir()
            self.run = Controlled(self._root, START, log=self._log, durable=False,
                                  scheduler_factory=lambda: _Scheduler(self), store_class=_RecordingStore)
        except BaseException:
            shutil.rmtree(self._root, ignore_errors=True)
            raise
        self.config = self.run.ctl.config
        tick = self.config.controller.tick
        self.interval = tick if interval is None else interval
        if self.interval < 0:
            self.close()
            raise SpecError(f"interval {self.interval}: give 0 (every instant) or a positive number of seconds")
        names = {h.name for h in self.config.hosts}
        for event in workload.hosts:
            if event.host not in names:
                self.close()
                raise SpecError(f"workload {workload.source}: host event for {event.host!r}, which the config does "
                                f"not have (its hosts: {', '.join(sorted(names))})")
        self._wake_after = self.interval or tick or 1.0
        self.entries = sorted(workload.jobs, key=lambda e: (e.submit, e.row))
        self.job_count = sum(len(e.array[1]) if e.array else 1 for e in self.entries)  # ids it may come to
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
        self.last: Step | None = None  # the last instant's
        self._specs = EntrySpecs(self._root / "work")  # each entry's spec and wire form

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
        if self.run.wants_tick or self.run.loss_to_come():
            times.append(self.now + self._wake_after)
        if not times:
            return None
        t = max(min(times), self.now)
        if self.interval > 0:
            t = math.ceil(round(t / self.interval, 9)) * self.interval
        return max(t, self.now)

    @property
    def finished(self) -> bool:
        return self.next_instant() is None

    def step(self, traced: Callable[[int], bool] | None = None) -> Step | None:
        """Run one instant (module docstring); None when the simulation is over. `traced`: which
        jobs' `core.Examined` values the step keeps (tracing reads, never decides)."""
        t = self.next_instant()
        if t is None:
            return None
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
        sessions = self.sessions
        self._traced, self._examined = traced, []
        try:
            self.run.advance(clock)
        finally:
            self._traced = None
        self.last = self._step(self.sessions if self.sessions > sessions else None, tuple(self._examined))
        self._examined = []
        if self.after_tick is not None:
            self.after_tick(self)
        return self.last

    def _step(self, session: int | None, examined: tuple) -> Step:
        """What this instant submitted, and what the controller's tick stored."""
        store = self.run.ctl.store
        assert isinstance(store, _RecordingStore)  # the store this class gave the controller
        writes, store.writes = store.writes, []
        submitted, self._submitted = self._submitted, []
        rejected, self._rejected_now = self._rejected_now, []
        reasons: dict[str, list[int]] = {}
        for w in writes:
            for job_id, reason in sorted(w.reasons.items()):
                reasons.setdefault(reason or "", []).append(job_id)
        pending, running = self.run.counts()
        return Step(self.steps, self.now, session, tuple(submitted), tuple(rejected),
                    tuple((p.job_id, p.attempt, tuple((h[0], h[1]) for h in p.hosts)) for w in writes for p in w.plans),
                    tuple((f.job_id, f.state, f.exit_code) for w in writes for f, _event in w.finishes),
                    tuple((r.job_id, r.reason) for w in writes for r in w.requeues),
                    tuple((job_id, why) for w in writes for job_id, _state, why in w.cancels),
                    tuple((r, tuple(ids)) for r, ids in reasons.items()), pending, running, examined)

    def run_to_end(self, stop_at: float | None = None) -> None:
        while True:
            t = self.next_instant()
            if t is None or (stop_at is not None and t > stop_at):
                return
            self.step()

    def _submit(self, entries: list[WorkloadJob]) -> None:
        """One user's jobs due at one instant, in one request (one commit, ids in order); if the
        controller refuses the request, each job alone, so that only the wrong ones are rejected."""
        made = [self._specs.of(e) for e in entries]
        specs = [spec for spec, _wire in made]
        if len(entries) > 1:
            try:
                ids = self.run.submit_wires([wire for _spec, wire in made], entries[0].user)
            except SpecError:
                pass
            else:
                for entry, first in zip(entries, ids):
                    self._number(entry, first)
                return
        for entry, spec in zip(entries, specs):
            try:
                first = self.run.submit_spec(spec, entry.user)
            except SpecError as err:
                self.rejected.append((entry.row, str(err)))
                self._rejected_now.append((entry.row, str(err)))
                continue
            self._number(entry, first)

    def _number(self, entry: WorkloadJob, first: int) -> None:
        """The ids of an entry's jobs (an array's elements are consecutive from its first)."""
        for i in range(len(entry.array[1]) if entry.array else 1):
            self.rows[first + i] = entry.row
            self._submitted.append(first + i)

    # ---- the outcome

    def outcomes(self, ids: list[int] | None = None, include_finished: bool = True) -> list[Outcome]:
        """The submitted jobs (or those of `ids`) as the controller stored them, by id."""
        found = []
        for job in self.run.ctl.store.jobs(ids, include_finished=include_finished):
            name = job.spec.name if job.array_id is None else f"{job.spec.name}[{job.array_index}]"
            found.append(Outcome(
                job.id, self.rows.get(job.id, 0), name, job.user, job.queue, job.state, job.submit_time - START,
                None if job.start_time is None else job.start_time - START,
                None if job.end_time is None else job.end_time - START, job.exit_code, job.attempt,
                tuple(job.hosts), job.reason if job.reason is not None else job.pend_reason, job.alloc,
                job.effective, job.array_id))
        return found

    def dispatch_order(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """(job, attempt, hosts) of every dispatch, in the order the controller recorded them."""
        order = []
        store = self.run.ctl.store
        for outcome in self.outcomes():
            for seq, (time, kind, data) in enumerate(store.events(outcome.id)):
                if kind == "dispatched":
                    hosts = tuple(h[0] if isinstance(h, list) else h for h in (data or {}).get("hosts", ()))
                    order.append((time, seq, outcome.id, (data or {}).get("attempt", 0), hosts))
        return [(job, attempt, hosts) for _, _, job, attempt, hosts in sorted(order)]

    # ---- snapshots: where the run is, taken up again by replaying to it

    def digest(self) -> str:
        """A hash of every job's stored record, the clock and the counters: equal runs, equal digests."""
        rows = [[o.id, o.state, o.attempt, [list(h) for h in o.hosts], o.start, o.end, o.exit_code, o.reason]
                for o in self.outcomes()]
        text = canonical({"jobs": rows, "now": self.now, "steps": self.steps, "sessions": self.sessions,
                          "submitted": self._next, "rejected": self.rejected})
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def state(self) -> dict:
        """Where the run is (JSON-able): what `restore` replays to and checks."""
        states: dict[str, int] = {}
        for o in self.outcomes():
            states[o.state] = states.get(o.state, 0) + 1
        return {"step": self.steps, "now": self.now, "sessions": self.sessions, "digest": self.digest(),
                "states": states}

    def restore(self, state: dict) -> None:
        """Take up a `state()` of a simulation of the same config, workload and interval (the caller
        checks them): run this fresh one to that step and check it got where that one was."""
        if self.steps:
            raise ValueError("restore takes a fresh simulation")
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise SpecError(f"snapshot state {state!r}: no step to go to; give a file `snapshot save` or --save wrote")
        while self.steps < step and self.step() is not None:
            pass
        if self.steps != step or self.digest() != state.get("digest"):
            now = state.get("now")
            at = f"{now:g}" if isinstance(now, (int, float)) else "?"
            raise SpecError(f"the snapshot does not replay to the state it saved (step {step}, t={at}): "
                            f"it was saved by another version of xce_lite; run from the start instead")

    def close(self) -> None:
        self.run.close()
        shutil.rmtree(self._root, ignore_errors=True)
