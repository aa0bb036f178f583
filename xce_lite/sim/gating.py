"""Dependencies and array throttles in the simulator: the controller's own gate (gate.py) and
dependency language (deps.py), with names resolved as the controller resolves them.

What the controller does, and so this does: a job's `-w` is parsed and resolved when it is
submitted (deps.parse, deps.resolve); a name is the submitting user's most recent job or array of
that name submitted so far (`*` matches any text, and each matching name must meet the condition);
an id names a job, or a whole array by its first element's id; `name[7]` or `42[7]` one element. A
ref that names nothing refuses the submit (SpecError: the simulator records it as rejected). A job
with a dependency, or an element of an array with a throttle, waits in the `Gate`, which says each
step which to feed to the scheduler, which to take back, and which to cancel (a dependency that can
never hold: EXIT, with the reason). Facts come from the simulated jobs' states, as the controller
reads them from its store: (state, exit code, has started) per job, grouped per array.
"""

from __future__ import annotations

import fnmatch

from xce_lite.errors import SpecError
from xce_lite.workflow import deps, deps_eval
from xce_lite.workflow.gate import Decision, Gate, Waiter


class Workflows:
    """The gate and the name registry of one simulation. `jobs` is the simulator's list, by id - 1."""

    def __init__(self, jobs: list) -> None:
        self.jobs = jobs
        self.gate = Gate()
        self.dirty = False  # a state changed since the gate last decided
        self._named: dict[str, dict[str, deps.Target]] = {}  # user -> name -> the most recent job or array
        self._exprs: dict[int, deps.Expr | None] = {}  # array id -> the dependency its elements share
        self.started_matters = False  # a waiter has a started() condition: a dispatch can release it

    def resolve(self, job) -> deps.Expr | None:
        """The job's dependency resolved now; SpecError naming what names nothing."""
        e = job.entry
        if e.after is None:
            return None
        if job.array_id is not None and job.array_id in self._exprs:
            return self._exprs[job.array_id]
        expr = deps.resolve(deps.parse(e.after), lambda ref: self._lookup(ref, e.user, e.after))
        if job.array_id is not None:
            self._exprs[job.array_id] = expr
        return expr

    def register(self, job) -> None:
        """A submitted job's name now means it (an array's name means the array)."""
        if job.array_id is not None and job.array_id != job.id:
            return
        name = job.array if job.array is not None else job.name
        if name:
            target = deps.Target(job.id, job.array is not None, name)
            self._named.setdefault(job.entry.user, {})[name] = target

    def add(self, job, expr: deps.Expr | None) -> bool:
        """Put a submitted job in the gate if it has a dependency or a throttle; False if it goes
        straight to the pending set."""
        throttle = job.entry.array[2] if job.array_id is not None else None
        if expr is None and throttle is None:
            return False
        self.gate.add(Waiter(job.id, expr, "cancel", job.array_id, throttle))
        self.dirty = True
        if expr is not None and _asks_started(expr):
            self.started_matters = True
        return True

    def decide(self, active: dict[int, int]) -> Decision | None:
        """The gate's decision against the jobs' states now (`active`: array id -> its elements
        running); None when nothing changed or the gate is empty."""
        if not self.dirty or not len(self.gate):
            return None
        self.dirty = False
        memo: dict[deps.Target, deps_eval.GroupFacts | None] = {}

        def facts(target: deps.Target) -> deps_eval.GroupFacts | None:
            if target not in memo:
                members = self.elements(target.id) if target.array else \
                    [self.jobs[target.id - 1]] if 1 <= target.id <= len(self.jobs) else []
                memo[target] = deps_eval.group_facts((j.state, j.exit_code, j.start is not None) for j in members) \
                    if members else None
            return memo[target]

        return self.gate.decide(facts, active)

    def _lookup(self, ref: deps.Ref, user: str, text: str) -> list[deps.Target]:
        if ref.id is not None:
            if not 1 <= ref.id <= len(self.jobs) or self.jobs[ref.id - 1].state in ("WAIT", "REJECTED"):
                raise SpecError(f"-w: there is no job {ref.id} (yet) in this simulation")
            job = self.jobs[ref.id - 1]
            if ref.index is not None:
                return [self._element(job.id if job.array_id == job.id else None, ref)]
            return [deps.Target(job.id, job.array_id == job.id, ref.text())]
        mine = self._named.get(user, {})
        pattern = ref.name or ""
        names = sorted(n for n in mine if fnmatch.fnmatchcase(n, pattern)) if "*" in pattern else \
            [pattern] if pattern in mine else []
        if not names:
            raise SpecError(f"-w {text!r}: user {user} has no job named {pattern!r} submitted before this one")
        if ref.index is not None:
            return [self._element(mine[n].id if mine[n].array else None, ref) for n in names]
        return [deps.Target(mine[n].id, mine[n].array, n) for n in names]

    def elements(self, array_id: int) -> list:
        """An array's elements: consecutive ids from its first."""
        first = self.jobs[array_id - 1]
        return self.jobs[array_id - 1:array_id - 1 + len(first.entry.array[1])]

    def _element(self, array_id: int | None, ref: deps.Ref) -> deps.Target:
        for job in self.elements(array_id) if array_id is not None else ():
            if job.index == ref.index:
                return deps.Target(job.id, False, ref.text())
        raise SpecError(f"-w: {ref.text()}: no such array element")


def _asks_started(expr: deps.Expr) -> bool:
    if isinstance(expr, deps.Cond):
        return expr.kind == "started"
    if isinstance(expr, deps.Not):
        return _asks_started(expr.operand)
    return any(_asks_started(item) for item in expr.items)
