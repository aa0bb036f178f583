"""Kill wins: a job someone killed is never requeued, retried or started again, whatever its host does.

A mixin of `Controller` (it shares the controller's lock and view). The kill is recorded in the
store (`kill_requested`, with its reason) before anything is sent, so it survives a restart; the
store itself refuses to requeue such a job (store/jobs.py `_requeue`). Then:

- delivery: a kill mark per job (`_kill_marks`, kept from unitwork) is sent to the job's first
  host by its host worker (hostops.py), never on the tick's thread; a host out of reach or in
  trouble gets it when it answers again; a unit not there yet (its launch in flight) is tried
  again a second later, and a dispatch not yet launched never starts (unitwork `_launch`);
- the end: EXIT with the kill's reason once the host reports the unit ended (its result carries
  the reason), or at once when the host is declared lost (`_lost_victim`): never a requeue.
- after a restart every killed active job is marked again (a second TERM costs nothing; a lost
  first one would let the job run on).

Copies on lost hosts: a job handled as lost leaves its units draining; a copy that still runs when
its host answers again is stopped, and the result of a copy the controller gave up on is recorded
as a `host_hooks` event at most, never as the job's outcome (unitwork `_unit_finished`).
"""

from __future__ import annotations


from xce_lite.controller.hostops import CallDone, HostAnswers, SignalDone
from xce_lite.models import DISP, EXIT
from xce_lite.store.jobs import Finish, Requeue

KILL_RETRY = 1.0  # seconds before a kill whose unit was not found yet is sent again


class Kills:
    """See the module docstring. Expects the controller's attributes (store, _mu, _active, ...)."""

    def _init_kills(self) -> None:
        self._kill_inflight: set[int] = set()  # jobs whose kill is on its way to their host
        self._kill_next: dict[int, float] = {}  # job id -> monotonic time before which it is not re-sent

    def _mark_killed(self, job_id: int, reason: str) -> None:
        """Someone killed active job `job_id` (recorded in the store already). Holds _mu."""
        self._kill_marks[job_id] = reason
        self._kill_next.pop(job_id, None)
        job = self._active.get(job_id)
        if job is not None and not job.killed:
            job.killed = reason  # its failure is not retried; a lost host ends it, never requeues it

    def _deliver_kill_marks(self) -> None:
        """Send each kill to its job's first host, unless one is on its way or its host cannot take it."""
        now = self._clock.monotonic()
        sends = []
        with self._mu:
            for job_id, reason in self._kill_marks.items():
                job = self._active.get(job_id)
                if job is None or job_id in self._kill_inflight or self._kill_next.get(job_id, 0.0) > now:
                    continue
                name = job.host_of(0)
                host = self._hosts.get(name)
                if host is None or name in self.trouble:
                    continue  # delivered when the host answers again (or the job ends when it is lost)
                self._kill_inflight.add(job_id)
                sends.append((name, self._generation.get(name, 0), host, job.units[0], reason, job_id))
        for name, generation, host, unit, reason, job_id in sends:
            self._hostops.signal(name, generation, host, unit, "TERM", reason, job_id)

    def _signal_done(self, done: SignalDone) -> None:
        """A signal's outcome (a kill's or a stop's). Holds _mu."""
        current = done.generation == self._generation.get(done.host) and done.host in self._hosts
        if done.job_id is not None:
            self._kill_inflight.discard(done.job_id)
        if done.error is not None:
            if current and done.trouble:
                self.trouble.enter(done.host, done.error)
            if done.job_id is None:
                self.log(f"host {done.host}: could not stop unit {done.unit}: {done.error}")
            elif not done.trouble:  # refused, not lost: try again shortly, as for a unit not there yet
                self._kill_next[done.job_id] = self._clock.monotonic() + KILL_RETRY
            return  # a kill stays marked: sent again once the host answers
        if current:
            self.trouble.leave(done.host)
        if done.job_id is None:
            return
        if done.found:
            self._kill_marks.pop(done.job_id, None)
            self._kill_next.pop(done.job_id, None)
        else:  # not there yet (its launch in flight) or ended meanwhile: try again shortly
            self._kill_next[done.job_id] = self._clock.monotonic() + KILL_RETRY
            self._wake.set()

    def _call_done(self, done: CallDone) -> None:
        """Another round trip's outcome (task_launches.py sends them): trouble, or out of it. Holds _mu."""
        current = done.generation == self._generation.get(done.host) and done.host in self._hosts
        if current and done.trouble:
            self.trouble.enter(done.host, done.error or "no answer")
        elif current and done.error is None:
            self.trouble.leave(done.host)
        if done.error is not None:
            self._task_call_failed(done.host, done.about, done.error)

    def _host_answers(self, answer: HostAnswers) -> None:
        """Holds _mu."""
        if answer.generation == self._generation.get(answer.host) and answer.host in self._hosts:
            self.trouble.leave(answer.host)

    def _kills_reset(self, name: str) -> None:
        """Host `name` connected again or went away: its kills in flight are sent again when it
        answers (their worker is retired with its connection). Holds _mu."""
        self._hostops.retire(name)
        self.trouble.reset(name)
        for job_id in list(self._kill_inflight):
            job = self._active.get(job_id)
            if job is None or job.host_of(0) == name:
                self._kill_inflight.discard(job_id)

    def _lost_victim(self, job, why: str, now: float) -> None:
        """A job on a host declared lost: killed, it ends EXIT with the kill's reason; else it is
        requeued or ends EXIT as `controller.on_host_lost` says. Holds _mu."""
        if job.killed:
            self._kill_marks.pop(job.id, None)
            self._end_job(job, EXIT, f"{job.killed} ({why}, before it confirmed the kill)", "lost", now)
        elif self.config.controller.on_host_lost == "requeue":
            job.ending = True
            self._unrecorded_requeues.append(Requeue(job.id, job.state, why))
        else:
            self._end_job(job, EXIT, why, "lost", now)

    def _kill_wins(self, requeues: list[Requeue], finishing: list[tuple[Finish, str]],
                   now: float) -> list[Requeue]:
        """The requeues to store, less those of jobs killed since they were decided, which end
        EXIT instead (appended to `finishing`). The store refuses them too; this gives them their
        event and their place in memory. Holds _mu."""
        kept = []
        for r in requeues:
            job = self._active.get(r.job_id)
            if job is None or not job.killed:
                kept.append(r)
                continue
            start = None if job.state == DISP else now
            finishing.append((Finish(job.id, r.from_state, EXIT, start, now, None, None, None, None,
                                     f"{job.killed} (not requeued: {r.reason})"), "finished"))
        return kept
