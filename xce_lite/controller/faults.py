"""How the controller outlives faults: a store that cannot take the tick's commit, hosts in trouble,
and the one kind of fault it does not go on after.

A part of the controller (`Controller.faults`); the store-commit retry state is a part of its own
(store_retry.StoreRetry, `Controller.commits`), as are hosts in trouble (host_trouble.HostTrouble,
`Controller.trouble`) and the record of a fatal fault (fault_record.FaultRecord,
`Controller.fault_record`); this one joins them to the shared state, the kills and the task
launches. Three promises:

- A store that is busy (another process holds the write lock past the busy timeout) or full: the
  tick's commit fails as a whole (nothing of it is stored), everything it carried goes back to the
  front of what waits to be stored (host reports, requeues, hook events: nothing learned is lost),
  pend reasons and gate decisions are computed again, and the commit is tried again with a backoff
  (STORE_RETRY_FIRST doubling to STORE_RETRY_MAX). Until it succeeds nothing is acted on that needs
  the commit first (forgetting units, launching new dispatches); kills recorded earlier are still
  delivered. `xce controller status` says what is wrong; reads go on; writes are refused with exit 4.
- A host operation that fails (a signal whose reply does not come) puts that host alone in trouble,
  with the reason in `xce hosts -l`; the scheduler places nothing there until it answers again.
- A fault that makes going on unsafe (a corrupt store, a bug that left the in-memory view in an
  unknown state) stops the controller: the reason goes to its log and to `controller.fault` in the
  home (daemon.py), which the next start reads and `xce controller status` shows.
"""

from __future__ import annotations

from collections.abc import Callable

from xce_lite import errors
from xce_lite.controller.fault_record import FaultRecord
from xce_lite.controller.hostops import CallDone, HostAnswers, SignalDone
from xce_lite.controller.host_trouble import HostTrouble
from xce_lite.controller.kill_marks import KillMarks
from xce_lite.controller.shared import Access
from xce_lite.controller.state import ControllerState
from xce_lite.controller.store_retry import StoreRetry
from xce_lite.controller.task_launches import TaskLaunches
from xce_lite.store.jobs import Finish, Requeue


def replan(state: ControllerState, wake: bool) -> None:
    """What the scheduler may use changed (a host in or out of trouble); `wake`: tick at once. Holds the lock."""
    state.dirty = True
    if wake:
        state.wake.set()


class Faults:
    """See the module docstring. Given the shared state, the commit retry, the hosts in trouble, the
    fault record, the kills, the task launches, the access rules and the log."""

    def __init__(self, state: ControllerState, commits: StoreRetry, trouble: HostTrouble, fault_record: FaultRecord,
                 kills: KillMarks, launches: TaskLaunches, access: Access, log: Callable[[str], None]) -> None:
        self.state, self.commits, self.trouble, self.fault_record = state, commits, trouble, fault_record
        self.kills, self.launches, self.access, self.log = kills, launches, access, log

    # ---- the store ----------------------------------------------------------------------------

    def commit_failed(self, err: errors.StoreUnavailable, carried: tuple) -> None:
        """The tick's commit did not happen: put back what it carried, back off, say so once."""
        finishing, started, requeues, events, reasons = carried
        self.put_back(finishing, started, requeues, events, reasons)
        self.commits.failed(err, self.waiting_to_store)

    def put_back(self, finishing: list[tuple[Finish, str]], started: list[tuple[int, float]],
                  requeues: list[Requeue], events: list[tuple[int, str, dict]], reasons: dict) -> None:
        """Everything a failed commit carried waits again, ahead of what came meanwhile."""
        with self.state.mu:
            self.state.unrecorded[:0] = finishing
            self.state.unrecorded_started[:0] = started
            self.state.unrecorded_requeues[:0] = requeues
            self.state.host_hook_events[:0] = events
            for job_id in reasons:  # stored with the next flush
                self.state.stored_reasons.pop(job_id, None)
            self.state.gate_dirty = True  # the gate's cancels are decided again
            self.state.dirty = True  # and the dispatches
            self.state.wake.set()

    def waiting_to_store(self) -> int:
        """Host reports and decisions not stored yet: waiting, or in the commit being tried."""
        return (len(self.state.unrecorded) + len(self.state.unrecorded_started) + len(self.state.unrecorded_requeues)
                + len(self.state.host_hook_events) + self.commits.in_commit)

    # ---- hosts in trouble ---------------------------------------------------------------------

    def scheduler_states(self) -> dict[str, str]:
        """Host states as the scheduler reads them: a host in trouble takes no new work, nor one a
        shared cluster refuses (shared.py). Holds the lock."""
        refused = self.access.refused_hosts()
        if not self.trouble and not refused:
            return self.state.host_state
        return {**self.state.host_state, **{name: "unreachable" for name in self.trouble},
                **{name: "closed" for name in refused}}

    def signal_done(self, done: SignalDone) -> None:
        """A signal's outcome (a kill's or a stop's). Holds the lock."""
        current = done.generation == self.state.generation.get(done.host) and done.host in self.state.hosts
        if done.error is not None:
            if current and done.trouble:
                self.trouble.enter(done.host, done.error)
            if done.job_id is None:
                self.log(f"host {done.host}: could not stop unit {done.unit}: {done.error}")
        elif current:
            self.trouble.leave(done.host)
        if done.job_id is not None:
            self.kills.done(done)  # a kill's: landed, or sent again (kill_marks.py)

    def call_done(self, done: CallDone) -> None:
        """Another round trip's outcome (task_launches.py sends them): trouble, or out of it. Holds the lock."""
        current = done.generation == self.state.generation.get(done.host) and done.host in self.state.hosts
        if current and done.trouble:
            self.trouble.enter(done.host, done.error or "no answer")
        elif current and done.error is None:
            self.trouble.leave(done.host)
        if done.error is not None:
            self.launches.call_failed(done.host, done.about, done.error)

    def host_answers(self, answer: HostAnswers) -> None:
        """Holds the lock."""
        if answer.generation == self.state.generation.get(answer.host) and answer.host in self.state.hosts:
            self.trouble.leave(answer.host)

    def host_reset(self, name: str) -> None:
        """Host `name` connected again or went away: its kills in flight are sent again when it
        answers (their worker is retired with its connection), and it is judged afresh. Holds the lock."""
        self.kills.reset(name)
        self.trouble.reset(name)

    # ---- what `controller status` shows ------------------------------------------------------

    def status(self) -> dict:
        """The problems the controller lives with now, and why its previous run stopped (if it was a
        fault). Holds the lock."""
        problems = []
        store = self.commits.status(self.waiting_to_store())
        if store is not None:
            problems.append(store)
        for name, (why, since) in sorted(self.trouble.copy().items()):
            problems.append({"what": "host", "host": name, "since": since, "why": why,
                             "message": f"host {name} is in trouble: {why}"})
        return {"problems": problems, "previous_fault": self.fault_record.previous}
