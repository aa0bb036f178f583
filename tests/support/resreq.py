"""Builders for the `-R` language's tests (sched/resreq*.py): names `A`..`D`, comparisons `gt` and
`eq`, and `select(text)`, the parsed expression of `select[text]`."""

from __future__ import annotations

from xce_lite.sched import resreq as rr
from xce_lite.sched.resreq import Compare, Name, Number, String

A, B, C, D = Name("a"), Name("b"), Name("c"), Name("d")


def gt(name: str, value: float, unit: str | None = None) -> Compare:
    return Compare(">", Name(name), Number(value, unit))


def eq(name: str, value: str) -> Compare:
    return Compare("==", Name(name), String(value))


def select(text: str) -> object:
    return rr.parse(f"select[{text}]").select
