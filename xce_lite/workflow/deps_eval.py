"""Job dependencies (`-w`), judged: whether a resolved expression (deps.py) holds now, given what
its targets' jobs are (GroupFacts), and whether that can still change; and the lines that
say which conditions do not hold. Pure: see deps.py's docstring for the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from xce_lite.workflow.deps import And, Cond, Expr, Not, Target, labelled


# ---- what a target's jobs are ------------------------------------------------------------------


@dataclass(frozen=True)
class GroupFacts:
    """What a target's jobs are now: their count by state, how many ever started, how many ended
    without starting, and the exit codes of those that ended EXIT (None: killed by a signal)."""

    total: int
    states: tuple[tuple[str, int], ...]
    started: int = 0
    ended_unstarted: int = 0
    exit_codes: tuple[tuple[int | None, int], ...] = ()

    def count(self, state: str) -> int:
        return dict(self.states).get(state, 0)

    def summary(self) -> str:
        return ", ".join(f"{n} {state}" for state, n in self.states if n)


def group_facts(rows: Iterable[tuple]) -> GroupFacts:
    """From (state, exit code, has started[, how many]) rows, one (or `how many`) per job of a group."""
    states: dict[str, int] = {}
    codes: dict[int | None, int] = {}
    total = started = unstarted = 0
    for state, code, has_started, *count in rows:
        n = count[0] if count else 1
        total += n
        states[state] = states.get(state, 0) + n
        started += n if has_started else 0
        if state in ("DONE", "EXIT") and not has_started:
            unstarted += n
        if state == "EXIT":
            codes[code] = codes.get(code, 0) + n
    return GroupFacts(total, tuple(sorted(states.items())), started, unstarted,
                      tuple(sorted(codes.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))))


@dataclass(frozen=True)
class Verdict:
    value: bool  # the condition holds now
    final: bool  # and that can no longer change

    @property
    def never(self) -> bool:
        return self.final and not self.value


SATISFIED, WAITING = Verdict(True, True), Verdict(False, False)
Facts = Callable[[Target], GroupFacts | None]


def evaluate(expr: Expr, facts: Facts) -> Verdict:
    """Whether `expr` holds now, and whether it can still change (see the module docstring)."""
    if isinstance(expr, Cond):
        group = facts(expr.ref) if isinstance(expr.ref, Target) else None
        return Verdict(False, True) if group is None else _cond(expr, group)
    if isinstance(expr, Not):
        inner = evaluate(expr.operand, facts)
        return Verdict(not inner.value, inner.final)
    verdicts = [evaluate(item, facts) for item in expr.items]
    decisive = not isinstance(expr, And)  # an And is decided by a final False, an Or by a final True
    if any(v.final and v.value == decisive for v in verdicts):
        return Verdict(decisive, True)
    values = [v.value for v in verdicts]
    return Verdict(all(values) if isinstance(expr, And) else any(values), all(v.final for v in verdicts))


def _compare(value: int, op: str, n: int) -> bool:
    return {"==": value == n, "!=": value != n, ">": value > n, ">=": value >= n,
            "<": value < n, "<=": value <= n}[op]


def _range_verdict(low: int, high: int, op: str, n: int) -> Verdict:
    """A count that is `low` now and can only grow to `high`, compared with n: final when the
    comparison gives the same answer for every count in [low, high]."""
    now = _compare(low, op, n)
    if op in ("==", "!="):
        final = n < low or n > high or low == high
    else:  # monotone in the count: constant over the range when it agrees at both ends
        final = now == _compare(high, op, n)
    return Verdict(now, final)


def _cond(cond: Cond, g: GroupFacts) -> Verdict:
    done, exited = g.count("DONE"), g.count("EXIT")
    unfinished = g.total - done - exited
    kind = cond.kind
    if kind == "done":
        return SATISFIED if done == g.total else Verdict(False, exited > 0)
    if kind == "ended":
        return SATISFIED if unfinished == 0 else WAITING
    if kind == "started":
        return SATISFIED if g.started == g.total else Verdict(False, g.ended_unstarted > 0)
    if kind == "exit":
        matching = sum(n for code, n in g.exit_codes
                       if cond.op is None or (code is not None and _compare(code, cond.op, cond.value or 0)))
        if done or matching < exited:
            return Verdict(False, True)
        return SATISFIED if matching == g.total else WAITING
    n = g.total if cond.value is None else cond.value
    if kind == "numdone":
        return _range_verdict(done, done + unfinished, cond.op or "==", n)
    if kind == "numexit":
        return _range_verdict(exited, exited + unfinished, cond.op or "==", n)
    return _range_verdict(done + exited, g.total, cond.op or "==", n)  # numended


def describe(target: Target, group: GroupFacts | None) -> str:
    """`prep (job 41) is EXIT (exit code 3)`, `sims (array 42) has 5 DONE, 15 RUN of 20`."""
    name = f"{target.label} " if target.label and target.label != str(target.id) else ""
    if group is None:
        return f"{name}(job {target.id}) is unknown"
    if not target.array:
        state = group.states[0][0] if group.states else "?"
        code = group.exit_codes[0][0] if group.exit_codes else None
        return f"{name}(job {target.id}) is {state}" + (f" (exit code {code})" if code is not None else "")
    return f"{name}(array {target.id}) has {group.summary()} of {group.total}"


def unmet(expr: Expr, facts: Facts) -> list[str]:
    """One line per condition that does not hold now: the condition, then its job and state."""
    lines: list[str] = []

    def walk(node: Expr, negated: bool) -> None:
        if isinstance(node, Cond):
            verdict = evaluate(node, facts)
            if verdict.value == negated and isinstance(node.ref, Target):
                text = ("!" if negated else "") + labelled(node)
                lines.append(f"{text}: {describe(node.ref, facts(node.ref))}"
                             + (" (can never hold)" if verdict.final else ""))
        elif isinstance(node, Not):
            walk(node.operand, not negated)
        else:
            for item in node.items:
                walk(item, negated)

    if not evaluate(expr, facts).value:
        walk(expr, False)
    return lines
