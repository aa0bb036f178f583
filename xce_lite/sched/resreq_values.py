"""The values of the `-R` language (resreq.py says its syntax and their invariants): names,
literals, the select expression's nodes, order keys, rusage terms, span, and the ResReq that holds
them. Frozen, hashable and picklable dataclasses that check their invariants on construction, so
requirements cross the scheduler's process pool and serve as cache keys. Pure.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from xce_lite.errors import SpecError

UNIT_POWERS = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}
RESERVED_WORDS = frozenset({"and", "or", "not", "defined"})
COMPARE_OPS = ("==", "!=", "<", "<=", ">", ">=")
PER_VALUES = ("task", "host", "job")
UNSUPPORTED_RUSAGE_KEYS = frozenset({"duration", "decay"})
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# LSF reads a bare number for these in megabytes; everything else is a count.
_MEGABYTE_RESOURCES = frozenset({"mem", "swp", "swap", "tmp", "maxmem", "maxswp", "maxtmp"})


class ResReqError(SpecError):
    """A `-R` string is invalid. `position` is the 1-based column, or None (e.g. from `combine`)."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position

    def __reduce__(self):  # keep `position` when the error crosses the process pool
        return (type(self), (str(self), self.position))


def _check(condition: bool, message: str) -> None:
    # Programming errors in building values by hand; users' text is checked by the parser first.
    if not condition:
        raise ValueError(message)


def _check_name(name: object) -> None:
    _check(
        isinstance(name, str) and NAME_RE.fullmatch(name) is not None and name.lower() not in RESERVED_WORDS,
        f"{name!r} is not a resource name (an ASCII identifier other than and/or/not/defined)",
    )


def _check_number(value: object, unit: object) -> None:
    _check(
        isinstance(value, (int, float)) and not isinstance(value, bool)
        and (isinstance(value, int) or math.isfinite(value)),
        f"{value!r} is not a finite int or float",
    )
    _check(unit is None or unit in UNIT_POWERS, f"unit {unit!r} is not one of {', '.join(UNIT_POWERS)}")


def _check_count(value: object, what: str) -> None:
    _check(value is None or (type(value) is int and value >= 1), f"{what} must be None or an int >= 1")


@dataclass(frozen=True, slots=True)
class Name:
    """A resource or tag name; alone in a select it tests that the host has it (true or > 0)."""

    name: str

    def __post_init__(self) -> None:
        _check_name(self.name)


@dataclass(frozen=True, slots=True)
class Number:
    """A number as written: `4G` is Number(4, "G"); `4` is Number(4, None), read per resource."""

    value: int | float
    unit: str | None = None

    def __post_init__(self) -> None:
        _check_number(self.value, self.unit)


@dataclass(frozen=True, slots=True)
class String:
    """A string literal (`"EPYC 7"`, or a bare word on the right of a comparison)."""

    value: str

    def __post_init__(self) -> None:
        _check(isinstance(self.value, str), "String.value must be a str")


@dataclass(frozen=True, slots=True)
class Defined:
    """`defined(name)`: the host has the attribute at all, whatever its value."""

    name: str

    def __post_init__(self) -> None:
        _check_name(self.name)


@dataclass(frozen=True, slots=True)
class Compare:
    """`left op right`: a resource against a literal. `=` is stored as `==`; strings only == and !=."""

    op: str
    left: Name
    right: Number | String

    def __post_init__(self) -> None:
        _check(self.op in COMPARE_OPS, f"unknown comparison {self.op!r}")
        _check(isinstance(self.left, Name), "Compare.left must be a Name")
        _check(isinstance(self.right, (Number, String)), "Compare.right must be a Number or a String")
        _check(not isinstance(self.right, String) or self.op in ("==", "!="), "strings compare with == or !=")


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr

    def __post_init__(self) -> None:
        _check(isinstance(self.operand, _EXPR_TYPES), "Not.operand must be an expression")


def _flatten(node: And | Or) -> None:
    items: list[Expr] = []
    for item in node.items:
        _check(isinstance(item, _EXPR_TYPES), f"{type(node).__name__} items must be expressions")
        items.extend(item.items if type(item) is type(node) else (item,))
    _check(len(items) >= 2, f"{type(node).__name__} needs two or more items")
    object.__setattr__(node, "items", tuple(items))


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Expr, ...]

    def __post_init__(self) -> None:
        _flatten(self)


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Expr, ...]

    def __post_init__(self) -> None:
        _flatten(self)


Expr = And | Or | Not | Compare | Name | Defined
_EXPR_TYPES = (And, Or, Not, Compare, Name, Defined)


@dataclass(frozen=True, slots=True)
class OrderKey:
    name: str
    descending: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check(isinstance(self.descending, bool), "OrderKey.descending must be a bool")


@dataclass(frozen=True, slots=True)
class RusageTerm:
    """`name=amount[unit][/per]`: reserve `amount` per task (default), per host or per job."""

    name: str
    amount: int | float
    unit: str | None = None
    per: str = "task"

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check(self.name.lower() not in UNSUPPORTED_RUSAGE_KEYS, f"{self.name!r} is not a resource")
        _check_number(self.amount, self.unit)
        _check(self.amount >= 0, "rusage amounts cannot be negative")
        _check(self.per in PER_VALUES, f"per must be one of {PER_VALUES}")
        object.__setattr__(self, "amount", abs(self.amount))  # -0.0 would print as a negative amount


@dataclass(frozen=True, slots=True)
class Span:
    """How tasks spread: `ptile` tasks per host, all on `one_host`, in blocks of `block`, on at
    most `max_hosts` hosts. At least one is set; one_host excludes the others; block excludes ptile."""

    ptile: int | None = None
    one_host: bool = False
    block: int | None = None
    max_hosts: int | None = None

    def __post_init__(self) -> None:
        for field_name in ("ptile", "block", "max_hosts"):
            _check_count(getattr(self, field_name), field_name)
        _check(isinstance(self.one_host, bool), "Span.one_host must be a bool")
        _check(any((self.ptile, self.one_host, self.block, self.max_hosts)), "an empty span")
        _check(not self.one_host or (self.ptile, self.block, self.max_hosts) == (None, None, None),
               "hosts=1 cannot be combined with ptile, block or maxhosts")
        _check(self.block is None or self.ptile is None, "block cannot be combined with ptile")


@dataclass(frozen=True, slots=True)
class ResReq:
    """One parsed `-R` string. The empty ResReq() asks for nothing."""

    select: Expr | None = None
    order: tuple[OrderKey, ...] = ()
    rusage: tuple[RusageTerm, ...] = ()
    span: Span | None = None
    same: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(self.select is None or isinstance(self.select, _EXPR_TYPES), "select must be an Expr")
        _check(self.span is None or isinstance(self.span, Span), "span must be a Span")
        order, rusage, same = tuple(self.order), tuple(self.rusage), tuple(self.same)
        _check(all(isinstance(k, OrderKey) for k in order), "order holds OrderKeys")
        _check(all(isinstance(t, RusageTerm) for t in rusage), "rusage holds RusageTerms")
        for name in same:
            _check_name(name)
        for what, keys in (("order", [k.name for k in order]), ("rusage", [t.name for t in rusage]),
                           ("same", list(same))):
            _check(len(set(keys)) == len(keys), f"a name appears twice in {what}")
        # Sets in meaning, so sorted: equal requirements compare and hash equal.
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "rusage", tuple(sorted(rusage, key=lambda t: t.name)))
        object.__setattr__(self, "same", tuple(sorted(same)))
