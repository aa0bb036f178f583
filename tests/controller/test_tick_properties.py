"""The controller's promises under random sequences of requests and faults (hypothesis stateful
testing), run in-process on fake hosts with a fake clock and a real store (tests/support/inproc.py):
random submits (with retries, on one host or two, after another job), kills, holds and releases,
hosts cut off and back (also away past their lease, which stops their units), restarts from the
store, time passing. After every tick `check_invariants`; after every step:

- an acknowledged job is never lost: it is in the store, and once every host is back and every
  hold released, every job ends (DONE or EXIT) within bounded time;
- a job someone killed never runs again: no new attempt of it reaches a host, it is never pending;
  if it ends EXIT, the kill's reason comes first, however it ended;
- never two live copies: at most one live attempt of a job, each unit live on one host at most;
- resources are never over-allocated: the view's reservations (check_invariants) and the units
  really live on each host both fit its slots.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.support.inproc import InProc
from xce_lite.controller.invariants import check_invariants

HOSTS = ("h1", "h2")
SLOTS = 2
# seconds to finish everything at the end: at worst every job runs alone (3-task jobs cannot share the
# 4 slots), 12 jobs of at most 60 s, twice each (retry); the drain stops as soon as all ended
DRAIN = 12 * 60 * 2 + 60


def _attempt(unit: str) -> tuple[int, int]:
    """(job id, attempt) of a unit named xce-inproc-JOB-ATTEMPT-INDEX."""
    job, attempt, _index = unit.rsplit("-", 3)[1:]
    return int(job), int(attempt)


class TickMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.p = InProc(hosts=HOSTS, slots=SLOTS)
        self.p.step(0.1)
        self.acked: list[int] = []
        self.killed: dict[int, int] = {}  # job -> its last attempt when it was killed

    # ---- requests --------------------------------------------------------------------------------

    @precondition(lambda self: len(self.acked) < 12)
    @rule(runtime=st.sampled_from([3, 20, 60]), code=st.sampled_from([0, 0, 1]), retry=st.sampled_from([None, 1]),
          tasks=st.sampled_from([1, 1, 3]))
    def submit(self, runtime: int, code: int, retry: int | None, tasks: int) -> None:
        # 3 tasks on hosts of 2 slots: a unit on each of two hosts
        self.acked.append(self.p.submit(runtime=runtime, exit_code=code, retry=retry, slots=tasks))

    @precondition(lambda self: 0 < len(self.acked) < 12)
    @rule(data=st.data())
    def submit_after(self, data) -> None:
        """A job that waits for another (cancelled if that one can never be DONE)."""
        first = data.draw(st.sampled_from(self.acked))
        self.acked.append(self.p.submit(runtime=3, depend=f"done({first})"))

    def _active(self) -> list[int]:
        return sorted(self.p.ctl.state.active)

    @precondition(lambda self: self.acked)
    @rule(data=st.data())
    def kill(self, data) -> None:
        # mostly jobs that run, first those whose host is cut off (where a kill races the host's
        # loss), sometimes any (pending, held, ended)
        cut = [j for j in self._active() if self.p.ctl.state.active[j].host_of(0) in self.p.dropped]
        job_id = data.draw(st.sampled_from(cut or self._active() or self.acked) | st.sampled_from(self.acked))
        attempt = self.p.job(job_id).attempt
        reply = self.p.kill(job_id)
        if reply["ok"]:
            self.killed.setdefault(job_id, attempt)

    @precondition(lambda self: self.acked)
    @rule(data=st.data(), release=st.booleans())
    def hold_or_release(self, data, release: bool) -> None:
        job_id = data.draw(st.sampled_from(self.acked))
        (self.p.release if release else self.p.hold)(job_id)

    # ---- faults and time -------------------------------------------------------------------------

    @rule(data=st.data())
    def cut_off(self, data) -> None:
        busy = sorted({self.p.ctl.state.active[j].host_of(0) for j in self._active()} - set(self.p.dropped))
        host = data.draw(st.sampled_from(busy or HOSTS))
        if host not in self.p.dropped:
            self.p.drop(host)

    @rule(host=st.sampled_from(HOSTS))
    def back(self, host: str) -> None:
        if host in self.p.dropped:
            self.p.back(host)

    @precondition(lambda self: self.p.dropped)
    @rule(data=st.data())
    def away_past_the_lease_then_back(self, data) -> None:
        """A host cut off stays away past its lease, not long enough to be lost: it stops its units
        by itself (lease expiry, as the agent does), then answers with their results."""
        host = data.draw(st.sampled_from(sorted(self.p.dropped)))
        lease = self.p.ctl.config.controller.lease
        while self.p.clock.now - self.p.dropped[host] <= lease + 1:
            self.tick()
        self.p.back(host)

    @rule()
    def restart(self) -> None:
        self.p.restart()

    @rule(seconds=st.sampled_from([1, 45]))
    def time_passes(self, seconds: int) -> None:
        for _ in range(seconds):
            self.tick()

    def tick(self) -> None:
        self.p.step(1.0)
        check_invariants(self.p.ctl, set(self.killed))
        self.physical()

    # ---- the promises ----------------------------------------------------------------------------

    def physical(self) -> None:
        """What really runs on the hosts: one copy at most, within the slots, no killed job anew."""
        live_on: dict[str, str] = {}
        attempts: dict[int, set[int]] = {}
        for host, units in self.p.live_units().items():
            assert len(units) <= SLOTS, f"host {host} runs {units}, more than its {SLOTS} slots"
            for unit in units:
                assert unit not in live_on, f"unit {unit} runs on {live_on[unit]} and {host}"
                live_on[unit] = host
                job_id, attempt = _attempt(unit)
                attempts.setdefault(job_id, set()).add(attempt)
        for job_id, seen in attempts.items():
            assert len(seen) == 1, f"job {job_id} runs attempts {sorted(seen)} at once"
        for host in self.p.hosts.values():
            for unit in host.units:
                job_id, attempt = _attempt(unit)
                assert attempt <= self.killed.get(job_id, attempt), \
                    f"job {job_id} was killed at attempt {self.killed[job_id]}, yet attempt {attempt} ran"

    @invariant()
    def acknowledged_jobs_are_stored_and_killed_ones_stay_ended(self) -> None:
        for job_id in self.acked:
            job = self.p.job(job_id)
            assert job is not None, f"job {job_id} was acknowledged and is gone"
            if job_id in self.killed:
                assert job.state not in ("PEND", "PSUSP"), f"job {job_id} was killed, yet it is {job.state}"
                assert job.attempt <= self.killed[job_id], f"job {job_id} was killed, yet it ran again"

    @invariant()
    def a_killed_job_that_ends_carries_the_kill_reason(self) -> None:
        """However it ended (its host stopped it when the lease ran out, lost it, it failed): EXIT
        with the kill's reason first; DONE only if it ended well before the kill reached it."""
        kill = f"killed by {self.p.caller().user}"
        for job_id in self.killed:
            job = self.p.job(job_id)
            if job.state == "EXIT":
                assert (job.reason or "").startswith(kill), f"job {job_id} was killed, yet it ended: {job.reason}"

    def _open(self) -> dict[int, str]:
        return {j: self.p.job(j).state for j in self.acked if self.p.job(j).state not in ("DONE", "EXIT")}

    def teardown(self) -> None:
        try:
            for host in list(self.p.dropped):
                self.p.back(host)
            for job_id in self.acked:
                if self.p.job(job_id).state == "PSUSP":
                    self.p.release(job_id)
            for second in range(DRAIN):
                self.tick()
                if second % 10 == 0 and not self._open():
                    break
            assert not self._open(), f"jobs never ended: {self._open()}"
        finally:
            self.p.close()


TickMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
test_tick_promises = TickMachine.TestCase
