"""The gate between pending jobs and the scheduler: dependencies (`-w`) and array throttles (`%N`).

Pure: the controller hands it the facts (what the jobs a dependency names are now) and the count
of each array's active elements; it says which waiting jobs to feed to the scheduler's pending set,
which to take back, which to cancel, and why each of the others waits. No store, no clock.

Why here and not in the scheduler core: a job whose dependency does not hold, or an element beyond
its array's throttle, is not a candidate at all, whatever the hosts have free; keeping them out of
the pending set keeps the core's input (and its process's per-session feed) to the jobs that may
start, so a 10,000-element array with `%10` costs the scheduler 10 jobs, not 10,000. The core and
the simulator's traces see only candidates; the simulator gates its workload with this same class.

Rules (LSF's): a dependency is evaluated until the job is dispatched, so a job whose condition
stops holding (`!done(5)` once 5 is DONE) is taken back; one whose condition can never hold is
cancelled, or, with `on_dep_fail == "pend"`, waits with that reason until someone kills it. An
array with a throttle has at most N elements dispatched or running, plus fed and not yet
dispatched, at once; elements go in index order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xce_lite.workflow import deps, deps_eval

MAX_REASON_LINES = 3


@dataclass
class Waiter:
    """A pending job the gate decides for: one with a dependency, or an element of a throttled array."""

    job_id: int
    depend: deps.Expr | None = None  # resolved; an array's elements share one expression
    on_dep_fail: str = "cancel"
    array_id: int | None = None
    throttle: int | None = None  # of its array
    payload: Any = None  # what the caller needs to feed it (the controller: its PendingJob's makings)


@dataclass(frozen=True)
class Decision:
    feed: tuple[int, ...] = ()  # may be scheduled now
    unfeed: tuple[int, ...] = ()  # were fed, may not be any more (their dependency stopped holding)
    cancel: tuple[tuple[int, str], ...] = ()  # (job id, why): their dependency can never hold
    reasons: Mapping[int, str] = field(default_factory=dict)  # why the others wait


class Gate:
    def __init__(self) -> None:
        self.waiters: dict[int, Waiter] = {}
        self.fed: set[int] = set()

    def __len__(self) -> int:
        return len(self.waiters)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.waiters

    def add(self, waiter: Waiter) -> None:
        self.waiters[waiter.job_id] = waiter
        self.fed.discard(waiter.job_id)

    def remove(self, job_id: int) -> Waiter | None:
        self.fed.discard(job_id)
        return self.waiters.pop(job_id, None)

    def targets(self) -> set[deps.Target]:
        """Every job and array the waiting dependencies name (the facts `decide` needs)."""
        found: set[deps.Target] = set()
        seen: set[int] = set()
        for w in self.waiters.values():
            if w.depend is not None and id(w.depend) not in seen:
                seen.add(id(w.depend))
                found |= deps.targets(w.depend)
        return found

    def decide(self, facts: Callable[[deps.Target], deps_eval.GroupFacts | None],
               active: Mapping[int, int]) -> Decision:
        """What to do with every waiter now; `active`: array id -> its elements dispatched or running."""
        verdicts: dict[int, tuple[deps_eval.Verdict, str]] = {}  # by id() of a shared expression

        def judge(expr: deps.Expr) -> tuple[deps_eval.Verdict, str]:
            key = id(expr)
            if key not in verdicts:
                verdict = deps_eval.evaluate(expr, facts)
                lines = deps_eval.unmet(expr, facts) if not verdict.value else []
                text = "; ".join(lines[:MAX_REASON_LINES]) + ("; ..." if len(lines) > MAX_REASON_LINES else "")
                verdicts[key] = (verdict, text or deps.labelled(expr))
            return verdicts[key]

        feed, unfeed, cancel, reasons = [], [], [], {}
        eligible: dict[int, list[int]] = {}  # throttled array -> its elements that may go, in id order
        for job_id in sorted(self.waiters):
            w = self.waiters[job_id]
            if w.depend is not None:
                verdict, text = judge(w.depend)
                if not verdict.value:
                    if job_id in self.fed:
                        unfeed.append(job_id)
                    if verdict.never and w.on_dep_fail == "cancel":
                        cancel.append((job_id, f"dependency can never be satisfied: {text}"))
                    elif verdict.never:
                        reasons[job_id] = (f"its dependency can never be satisfied: {text}; it pends as asked "
                                           f"(--on-dep-fail pend) until you kill it")
                    else:
                        reasons[job_id] = f"waiting for its dependency: {text}"
                    continue
            if w.throttle is not None and w.array_id is not None:
                eligible.setdefault(w.array_id, []).append(job_id)
            elif job_id not in self.fed:
                feed.append(job_id)
        for array_id, ids in eligible.items():
            throttle = self.waiters[ids[0]].throttle or 0
            room = throttle - active.get(array_id, 0) - sum(1 for i in ids if i in self.fed)
            for job_id in ids:
                if job_id in self.fed:
                    continue
                if room > 0:
                    feed.append(job_id)
                    room -= 1
                else:
                    reasons[job_id] = (f"array {array_id} runs at most {throttle} elements at once (%{throttle}); "
                                       f"it waits for one to end")
        for job_id in unfeed:
            self.fed.discard(job_id)
        self.fed.update(feed)
        return Decision(tuple(feed), tuple(unfeed), tuple(cancel), reasons)
