"""Job arrays: `-J "name[1-100:2,5]%10"`, parsed, checked and expanded. Pure, standard library only.

An array is one submission of many elements that differ only by their index: ranges `1-100`,
steps `1-100:2` (1, 3, ..., 99), lists `1,5,9-12`, and a throttle `%10` (at most 10 elements
dispatched or running at once). Indices are whole numbers from 1 to MAX_INDEX; an array has 1 to
MAX_ARRAY_SIZE elements, each index once (an index given twice is refused: it is a typo, not a
wish to run it twice). The size is checked before anything is expanded, so `[1-999999999]` costs
nothing to refuse.

The elements are jobs of their own (own state, own attempts) that share their array's spec; the
job's environment shows XCE_ARRAY_INDEX, and `%I` in its output paths is its index (models.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xce_lite.errors import SpecError

MAX_ARRAY_SIZE = 10_000  # elements of one array; measured: bench/arrays.py accepts 10,000 in well under 1 s
MAX_INDEX = 1_000_000
_SUFFIX = re.compile(r"\[([^\[\]]*)\](?:%(\S*))?\s*$")
_TERM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]  # ascending, each once
    throttle: int | None = None  # None: no limit

    @property
    def size(self) -> int:
        return len(self.indices)

    def text(self) -> str:
        """Canonical: `[1-10,15]%3`; `parse(spec.text()) == spec`."""
        return f"[{format_indices(self.indices)}]" + (f"%{self.throttle}" if self.throttle is not None else "")


def split_name(text: str) -> tuple[str, str | None]:
    """`sims[1-20]%5` -> ("sims", "[1-20]%5"); a name without an index part -> (name, None)."""
    match = _SUFFIX.search(text)
    if match is None:
        return text, None
    return text[: match.start()], text[match.start():].strip()


def throttle_of(text: str) -> int | None:
    """The throttle of an array's canonical text (`ArraySpec.text()`), without expanding it."""
    head, sep, tail = text.rpartition("%")
    return int(tail) if sep and head.endswith("]") else None


def parse(text: str) -> ArraySpec:
    """`[1-100:2,5]%10` (the brackets optional) -> its indices and throttle; SpecError says what to fix."""
    body = text.strip()
    match = re.fullmatch(r"\[([^\[\]]*)\](?:%(.*))?", body) or re.fullmatch(r"([^\[\]%]*)(?:%(.*))?", body)
    if match is None:
        raise SpecError(f"array {text!r}: write the indices in brackets, e.g. name[1-100] or name[1-9:2,20]%5")
    ranges, throttle_text = match[1], match[2]
    throttle = None
    if throttle_text is not None:
        if not throttle_text.isdigit() or int(throttle_text) < 1:
            raise SpecError(f"array {text!r}: the throttle %{throttle_text} must be a whole number of at "
                            f"least 1 (the elements that may run at once)")
        throttle = int(throttle_text)
    terms = [t.strip() for t in ranges.split(",")]
    if not ranges.strip():
        raise SpecError(f"array {text!r} has no index; give some, e.g. [1-10]")
    bounds = []
    total = 0
    for term in terms:
        m = _TERM.fullmatch(term)
        if m is None:
            raise SpecError(f"array {text!r}: {term!r} is not an index, a range A-B or a stepped range A-B:STEP")
        first = int(m[1])
        last = int(m[2]) if m[2] is not None else first
        step = int(m[3]) if m[3] is not None else 1
        if first < 1 or last > MAX_INDEX:
            raise SpecError(f"array {text!r}: indices run from 1 to {MAX_INDEX}; {term} is outside")
        if last < first:
            raise SpecError(f"array {text!r}: the range {term} ends before it starts; "
                            + (f"write {last}-{first}" if last >= 1 else "it must end at 1 or more"))
        if step < 1:
            raise SpecError(f"array {text!r}: the step of {term} must be at least 1")
        bounds.append((first, last, step))
        total += (last - first) // step + 1
        if total > MAX_ARRAY_SIZE:
            raise SpecError(f"array {text!r} has more than {MAX_ARRAY_SIZE} elements, the most one array may "
                            f"have; split it into several arrays")
    indices: set[int] = set()
    for first, last, step in bounds:
        for index in range(first, last + 1, step):
            if index in indices:
                raise SpecError(f"array {text!r}: index {index} is given twice")
            indices.add(index)
    return ArraySpec(tuple(sorted(indices)), throttle)


def format_indices(indices: tuple[int, ...] | list[int]) -> str:
    """Ascending indices in short form: runs of consecutive ones as A-B, the rest as a list."""
    parts = []
    ordered = sorted(indices)
    start = prev = None
    for index in ordered + [None]:
        if index is not None and prev is not None and index == prev + 1:
            prev = index
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = index
    return ",".join(parts)
