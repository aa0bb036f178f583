"""Dependencies between workload jobs (`after: "done(a) && ended(b)"`, LSF's -w), for the simulator.

A NARROW SEAM: issue 7 (workflows) brings the project's own dependency language (xce_lite/deps.py),
which the controller will use; once it is merged, `parse` and `evaluate` here become calls into it so
that the simulator and the controller agree on what a dependency means. Until then, this is LSF's
core: `done(X)` (X ended DONE), `exit(X)` (ended EXIT), `ended(X)` (either), `started(X)` (it was
dispatched, or has ended), joined with `&&`, `||`, `!` and parentheses. X is a job name (all jobs of
that name, every element of an array) or a job id; a name no job has is an error at load.

`evaluate` answers True (satisfied), False (not yet) or None (can never be: `done(a)` once `a`
ended EXIT), from a function giving each job's state. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from xce_lite.errors import SpecError

CONDITIONS = {"done": ({"DONE"}, {"EXIT"}), "exit": ({"EXIT"}, {"DONE"}), "ended": ({"DONE", "EXIT"}, set()),
              "started": ({"DISP", "RUN", "DONE", "EXIT"}, set())}
_TOKEN = re.compile(r"\s*(?:(&&|\|\||!|\(|\))|(done|exit|ended|started)\(\s*([^()\s]+)\s*\))")


@dataclass(frozen=True)
class Cond:
    kind: str
    target: str


@dataclass(frozen=True)
class Op:
    op: str  # "&&", "||", "!"
    items: tuple


def parse(text: str) -> Cond | Op:
    """The expression; SpecError says where it stops making sense."""
    tokens, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SpecError(f"dependency {text!r}: cannot read it from {text[pos:].strip()!r}; write conditions "
                            f"such as done(a), exit(b), ended(c), started(d) joined by &&, || and !")
        tokens.append(m.group(1) or Cond(m.group(2), m.group(3)))
        pos = m.end()
    expr, rest = _or(tokens, text)
    if rest:
        raise SpecError(f"dependency {text!r}: unexpected {rest[0]!r}")
    return expr


def _or(tokens: list, text: str):
    left, tokens = _and(tokens, text)
    while tokens and tokens[0] == "||":
        right, tokens = _and(tokens[1:], text)
        left = Op("||", (left, right))
    return left, tokens


def _and(tokens: list, text: str):
    left, tokens = _not(tokens, text)
    while tokens and tokens[0] == "&&":
        right, tokens = _not(tokens[1:], text)
        left = Op("&&", (left, right))
    return left, tokens


def _not(tokens: list, text: str):
    if not tokens:
        raise SpecError(f"dependency {text!r}: a condition is missing at the end")
    head = tokens[0]
    if head == "!":
        inner, rest = _not(tokens[1:], text)
        return Op("!", (inner,)), rest
    if head == "(":
        inner, rest = _or(tokens[1:], text)
        if not rest or rest[0] != ")":
            raise SpecError(f"dependency {text!r}: a `(` is not closed")
        return inner, rest[1:]
    if isinstance(head, Cond):
        return head, tokens[1:]
    raise SpecError(f"dependency {text!r}: unexpected {head!r}")


def targets(expr: Cond | Op) -> set[str]:
    if isinstance(expr, Cond):
        return {expr.target}
    return set().union(*(targets(item) for item in expr.items))


def evaluate(expr: Cond | Op, states: Callable[[str], list[str]]) -> bool | None:
    """True, False (not yet) or None (never); `states(target)` lists the states of its jobs."""
    if isinstance(expr, Cond):
        good, bad = CONDITIONS[expr.kind]
        found = states(expr.target)
        if any(s in bad for s in found):
            return None
        return all(s in good for s in found)
    values = [evaluate(item, states) for item in expr.items]
    if expr.op == "!":  # a condition once true stays true (states only move on), so its negation never is
        return None if values[0] is True else True
    if expr.op == "&&":
        return None if None in values else all(values)
    return True if True in values else (None if all(v is None for v in values) else False)
