"""Kill delivery: each kill recorded in the store, on its way to its job's first host until it lands.

A part of the controller (`Controller.kills`), given its dependencies: the host operations (signals
run on a worker per host, never on the tick's thread), the clock, the hosts in trouble, the
controller's lock and wake, and the controller's view it reads (active jobs, connected hosts and
their connection generations). It owns the marks (job id -> the kill's reason), the kills in flight
and when a kill may be sent again. Invariants: a job has at most one kill in flight; a mark stays
until its host says it found the unit (or the job ends: `forget`); a host out of reach or in trouble
is not sent to (it gets the kill when it answers again); a kill that found no unit yet (a launch in
flight), or was refused, is sent again after KILL_RETRY seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from xce_lite.controller.hostops import SignalDone

KILL_RETRY = 1.0  # seconds before a kill whose unit was not found yet is sent again


class KillMarks:
    """See the module docstring. `mark`, `forget`, `get`, `done` and `reset` are called holding the
    controller's lock; `deliver` takes it itself (it sends outside it)."""

    def __init__(self, hostops: Any, clock: Any, trouble: Any, mu: threading.RLock, wake: Callable[[], None],
                 active: Mapping[int, Any], hosts: Mapping[str, Any], generation: Mapping[str, int]) -> None:
        self.hostops, self.clock, self.trouble, self.mu, self.wake = hostops, clock, trouble, mu, wake
        self.active, self.hosts, self.generation = active, hosts, generation
        self.marks: dict[int, str] = {}  # job id -> the kill's reason, until its host found the unit
        self.inflight: set[int] = set()  # jobs whose kill is on its way to their host
        self.next: dict[int, float] = {}  # job id -> monotonic time before which it is not re-sent

    def mark(self, job_id: int, reason: str) -> None:
        """Active job `job_id` was killed (recorded in the store already): send it (again) at once."""
        self.marks[job_id] = reason
        self.next.pop(job_id, None)
        job = self.active.get(job_id)
        if job is not None and not job.killed:
            job.killed = reason  # its failure is not retried; a lost host ends it, never requeues it

    def mark_once(self, job_id: int, reason: str) -> None:
        """Kill `job_id` unless a kill is marked for it already (whose reason stays)."""
        self.marks.setdefault(job_id, reason)

    def get(self, job_id: int) -> str | None:
        return self.marks.get(job_id)

    def forget(self, job_id: int) -> str | None:
        """The job ended (or will never start): no kill to send; the reason it had, if any."""
        return self.marks.pop(job_id, None)

    def __bool__(self) -> bool:
        return bool(self.marks)

    def deliver(self) -> None:
        """Send each kill to its job's first host, unless one is on its way or its host cannot take it."""
        now = self.clock.monotonic()
        sends = []
        with self.mu:
            for job_id, reason in self.marks.items():
                job = self.active.get(job_id)
                if job is None or job_id in self.inflight or self.next.get(job_id, 0.0) > now:
                    continue
                name = job.host_of(0)
                host = self.hosts.get(name)
                if host is None or name in self.trouble:
                    continue  # delivered when the host answers again (or the job ends when it is lost)
                self.inflight.add(job_id)
                sends.append((name, self.generation.get(name, 0), host, job.units[0], reason, job_id))
        for name, generation, host, unit, reason, job_id in sends:
            self.hostops.signal(name, generation, host, unit, "TERM", reason, job_id)

    def done(self, done: SignalDone) -> None:
        """A kill's outcome (`done.job_id` is set); the host's trouble is the caller's to judge."""
        job_id = done.job_id
        if job_id is None:  # a stop's outcome: faults.py never hands those here
            return
        self.inflight.discard(job_id)
        if done.error is not None:
            if not done.trouble:  # refused, not lost: try again shortly, as for a unit not there yet
                self.next[job_id] = self.clock.monotonic() + KILL_RETRY
            return  # a kill stays marked: sent again once the host answers
        if done.found:
            self.marks.pop(job_id, None)
            self.next.pop(job_id, None)
        else:  # not there yet (its launch in flight) or ended meanwhile: try again shortly
            self.next[job_id] = self.clock.monotonic() + KILL_RETRY
            self.wake()

    def reset(self, name: str) -> None:
        """Host `name` connected again or went away: its kills in flight are sent again when it
        answers (their worker is retired with its connection)."""
        self.hostops.retire(name)
        for job_id in list(self.inflight):
            job = self.active.get(job_id)
            if job is None or job.host_of(0) == name:
                self.inflight.discard(job_id)
