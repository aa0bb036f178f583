"""LSF's `-R` resource requirement language: value types, canonical text, and pure helpers.

The values are in `resreq_values.py`, the parser in `resreq_parse.py`; both are re-exported here,
so callers import this module only. Everything here is pure (no I/O, no clock) and every value is
a frozen, hashable, picklable dataclass, so requirements cross the scheduler's process pool and
serve as cache keys.

Syntax (`select[...]`, `order[...]`, `rusage[...]`, `span[...]`, `same[...]`, each at most once,
in any order, whitespace between them optional):

    select[mem>4G && (avx512 || type=="X86_64") && !defined(gpu)]
        `&&` `||` `!` (or `and` `or` `not`, any case); `==` (or `=`) `!=` `<` `<=` `>` `>=`;
        `defined(name)`; a bare name is a boolean test. Precedence: `!`, comparisons, `&&`, `||`.
        Because `!` binds tighter than a comparison, `!mem>4` is refused: write `!(mem>4)`.
        One side of a comparison is a resource name, the other a literal: a number with an
        optional unit, or a string. A bare word on the right is a string (`type==X86_64`); on the
        left it is the name; `4<mem` is stored as `mem>4`. Comparing two resources (`mem>maxmem`)
        is not supported, and strings compare only with `==` and `!=`. Strings take either quote,
        with `\\` escaping the next character; numbers may be negative here (`temp>-5`).
    order[-mem:slots]       keys separated by `:`, `,` or spaces; `-` sorts descending, `+` is default.
    rusage[mem=4G/host, lic=1/job, tmp=0]
        terms separated by `,` or `:`; `/task` (default), `/host` or `/job` says what the amount is
        for. `name=0` is kept (a later merge drops it). LSF's `duration=`, `decay=` and `||`
        alternatives are refused with a message.
    span[ptile=4:maxhosts=2]
        `ptile=N`, `hosts=1` (every task on one host; no other count), `block=N`, and our own
        `maxhosts=N` for "at most N hosts". Keys joined by `:` or `,`. Refused pairs: hosts=1 with
        ptile, block or maxhosts; block with ptile.
    same[type:model]        attribute names separated by `:` or `,`.
Refused with a hint: a bare condition without `select[...]` (LSF takes `-R "mem>4"`), the `cu` and
`affinity` sections, compound (`2*{...}`) and alternative (`... || ...`) requirements.

Invariants of the values (checked on construction, so `parse(format(r)) == r` for any ResReq):
names are ASCII identifiers other than `and`, `or`, `not`, `defined`; numbers are finite ints or
floats; `And`/`Or` hold two or more items and are flattened (`a && (b && c)` is `And(a, b, c)`);
rusage terms and `same` names are sorted and unique, order keys unique (their order matters).

Units: B, K, M, G, T (any case, optionally followed by B: `4GB` is `4G`), binary (1K = 1024). The
parser keeps a number as written (`Number(4, "G")`); `amount_in_base_units` applies the resource's
default unit to a bare number, and returns bytes for sizes. `default_unit` says, as LSF does,
that mem, swp, tmp and their max* forms are in megabytes; every other resource is a plain count,
on which a unit is just a multiplier. Host attributes given to `evaluate` must be in base units.

Repeated `-R` options (`combine`): selects are joined with `&&`; order keys are concatenated;
rusage terms and same names are united; identical repeats are kept once. Refused with a message
naming both `-R` options: one resource in rusage with two values as written (`mem=4096` and
`mem=4G` differ), one order key sorted both ways, two different span sections.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TypeVar

# The values and the parser, here too: callers import this module only (`rr.ResReq`, `rr.parse`)
from xce_lite.sched import resreq_parse as _parse
from xce_lite.sched.resreq_values import (
    UNIT_POWERS,
    And,
    Compare,
    Defined,
    Expr,
    Name,
    Not,
    Number,
    Or,
    OrderKey,
    ResReq,
    ResReqError,
    RusageTerm,
    Span,
    String,
    _MEGABYTE_RESOURCES,
    _check,
)
from xce_lite.sched.resreq_values import COMPARE_OPS as COMPARE_OPS
from xce_lite.sched.resreq_values import NAME_RE as NAME_RE
from xce_lite.sched.resreq_values import PER_VALUES as PER_VALUES
from xce_lite.sched.resreq_values import RESERVED_WORDS as RESERVED_WORDS
from xce_lite.sched.resreq_values import UNSUPPORTED_RUSAGE_KEYS as UNSUPPORTED_RUSAGE_KEYS


# ---------------------------------------------------------------- canonical text


def format(r: ResReq) -> str:
    """Canonical text: sections in the order select, order, rusage, span, same; "" for ResReq()."""
    parts = []
    if r.select is not None:
        parts.append(f"select[{format_expr(r.select)}]")
    if r.order:
        parts.append("order[" + ":".join(format_key(k) for k in r.order) + "]")
    if r.rusage:
        parts.append("rusage[" + ", ".join(format_term(t) for t in r.rusage) + "]")
    if r.span is not None:
        parts.append(f"span[{format_span(r.span)}]")
    if r.same:
        parts.append("same[" + ":".join(r.same) + "]")
    return " ".join(parts)


def format_expr(e: Expr) -> str:
    if isinstance(e, Or):
        return " || ".join(format_expr(item) for item in e.items)
    if isinstance(e, And):
        return " && ".join(f"({format_expr(i)})" if isinstance(i, Or) else format_expr(i) for i in e.items)
    if isinstance(e, Not):
        inner = format_expr(e.operand)
        return "!" + inner if isinstance(e.operand, (Name, Defined, Not)) else f"!({inner})"
    if isinstance(e, Compare):
        right = format_number(e.right) if isinstance(e.right, Number) else format_string(e.right.value)
        return f"{e.left.name}{e.op}{right}"
    if isinstance(e, Defined):
        return f"defined({e.name})"
    return e.name


def format_key(k: OrderKey) -> str:
    return ("-" if k.descending else "") + k.name


def format_number(n: Number) -> str:
    return _format_value(n.value) + (n.unit or "")


def _format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    # Shortest text that reads back as the same float, without the exponent the parser refuses.
    text = repr(value)
    if "e" in text:
        text = f"{Decimal(text):f}"
    return text if "." in text else text + ".0"


def format_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_term(t: RusageTerm) -> str:
    per = "" if t.per == "task" else "/" + t.per
    return f"{t.name}={_format_value(t.amount)}{t.unit or ''}{per}"


def format_span(s: Span) -> str:
    keys = [("hosts", 1 if s.one_host else None), ("ptile", s.ptile), ("block", s.block),
            ("maxhosts", s.max_hosts)]
    return ":".join(f"{key}={value}" for key, value in keys if value is not None)


# ---------------------------------------------------------------- helpers for later steps


def names(r: ResReq) -> set[str]:
    """Every resource or attribute name `r` mentions (not string values), to report unknown ones."""
    found = {k.name for k in r.order} | {t.name for t in r.rusage} | set(r.same)
    stack = [r.select] if r.select is not None else []
    while stack:
        e = stack.pop()
        if isinstance(e, (And, Or)):
            stack.extend(e.items)
        elif isinstance(e, Not):
            stack.append(e.operand)
        else:
            found.add(e.left.name if isinstance(e, Compare) else e.name)
    return found


def default_unit(name: str) -> str | None:
    """LSF's unit for a bare number: "M" for mem, swp, swap, tmp, maxmem, maxswp, maxtmp; else None."""
    return "M" if name in _MEGABYTE_RESOURCES else None


def amount_in_base_units(x: Number | RusageTerm, default: str | None) -> int | float:
    """The amount of `x` in base units: value * 1024**power(unit), the unit being x's own or else
    `default` (the resource's, see `default_unit`); no unit at all means the value as it is.
    For a size whose default is "M", that is bytes: `4G` and `4096` are both 4294967296.
    An int when the result is whole (`0.5K` is 512), else a float (`r15s<0.5` stays 0.5)."""
    _check(default is None or default in UNIT_POWERS, f"unknown default unit {default!r}")
    value = x.value if isinstance(x, Number) else x.amount
    unit = x.unit or default
    scaled = value if unit is None else value * 1024 ** UNIT_POWERS[unit]
    if isinstance(scaled, float) and scaled.is_integer():
        return int(scaled)
    return scaled


_T = TypeVar("_T")
_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
            ">": operator.gt, ">=": operator.ge}


def evaluate(expr: Expr | None, attrs: Mapping[str, object],
             unit_for: Callable[[str], str | None] = default_unit) -> bool:
    """Does a host with `attrs` satisfy `expr`? None (no select section) is satisfied by every host.

    `attrs` maps a name to a number in base units (bytes for sizes), a string, or True for a tag.
    A bare name is true when its value is True, a number > 0 or a non-empty string. A comparison
    with a missing name, or of a string with a number, is false (even `!=`); `defined(x)` is
    `x in attrs`. `unit_for(name)` gives the unit of a bare number compared with `name`."""
    if expr is None:
        return True
    if isinstance(expr, And):
        return all(evaluate(item, attrs, unit_for) for item in expr.items)
    if isinstance(expr, Or):
        return any(evaluate(item, attrs, unit_for) for item in expr.items)
    if isinstance(expr, Not):
        return not evaluate(expr.operand, attrs, unit_for)
    if isinstance(expr, Defined):
        return expr.name in attrs
    if isinstance(expr, Name):
        value = attrs.get(expr.name)
        if isinstance(value, (bool, str)):
            return bool(value)
        return isinstance(value, (int, float)) and value > 0
    have = attrs.get(expr.left.name)
    if isinstance(expr.right, String):
        return isinstance(have, str) and _COMPARE[expr.op](have, expr.right.value)
    if not isinstance(have, (int, float)):  # missing, or a string: bools are ints, tags are 1
        return False
    return _COMPARE[expr.op](have, amount_in_base_units(expr.right, unit_for(expr.left.name)))


def combine(reqs: Sequence[ResReq]) -> ResReq:
    """One ResReq from repeated `-R` options, by the rule in the module docstring.

    Raises ResReqError naming both options (`-R #1`, `-R #2`: 1-based, in the order given)."""
    selects = [r.select for r in reqs if r.select is not None]
    order: dict[str, tuple[int, OrderKey]] = {}
    rusage: dict[str, tuple[int, RusageTerm]] = {}
    span: tuple[int, Span] | None = None
    for i, r in enumerate(reqs, 1):
        for key in r.order:
            _merge(order, key.name, i, key, format_key, "order")
        for term in r.rusage:
            _merge(rusage, term.name, i, term, format_term, "rusage")
        if r.span is not None:
            if span is not None and span[1] != r.span:
                raise ResReqError(f"-R #{span[0]} has span[{format_span(span[1])}] but -R #{i} has "
                                  f"span[{format_span(r.span)}]: give one span")
            span = span or (i, r.span)
    return ResReq(
        select=None if not selects else selects[0] if len(selects) == 1 else And(tuple(selects)),
        order=tuple(k for _, k in order.values()),
        rusage=tuple(t for _, t in rusage.values()),
        span=None if span is None else span[1],
        same=tuple(sorted({name for r in reqs for name in r.same})),
    )


def _merge(seen: dict[str, tuple[int, _T]], name: str, i: int, item: _T, show: Callable[[_T], str],
           section: str) -> None:
    if name not in seen:
        seen[name] = (i, item)
    elif seen[name][1] != item:
        j, first = seen[name]
        raise ResReqError(f"-R #{j} has {section}[{show(first)}] but -R #{i} has {section}[{show(item)}]: "
                          f"give {name} once, or the same in both")


def parse(text: str) -> ResReq:
    """Parse one `-R` string; "" gives ResReq(). Raises ResReqError (a SpecError) with the column."""
    return _parse.parse(text)
