"""Builders for the placement engine's tests (sched/placement.py): `host(...)` with slots, memory,
GPUs, custom resources, tags and attributes, what is used of them; `job(n, R)`; `slots_only(...)`;
`placed(result)`, the hosts of a placement (failing with the refusal's summary otherwise)."""

from __future__ import annotations

import re

from tests.support.sched import G
from xce_lite.sched import resreq as rr
from xce_lite.sched.placement import HostView, JobRequest, Placement
from xce_lite.sched.reasons import Refusal

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": G, "T": 1024**4}


def size(text: str | int) -> int:
    if isinstance(text, int):
        return text
    number, unit = re.fullmatch(r"(\d+)([KMGT]?)", text).groups()  # type: ignore[union-attr]
    return int(number) * _UNITS[unit]


def host(name: str, slots: int = 4, mem: str | int = "8G", gpus: int = 0, *, state: str = "ok",
         tags: tuple[str, ...] = (), used: dict[str, object] | None = None, gpu_used: tuple[int, ...] = (),
         res: dict[str, float] | None = None, **attrs: str) -> HostView:
    """A host with `slots`, `mem` and `gpus` (indices 0..gpus-1), custom `res`; `used` is taken off
    the free amounts (sizes as text), `gpu_used` off the free GPU indices."""
    total = {"slots": slots, "mem": size(mem), "gpus": gpus, **(res or {})}
    free = dict(total)
    for resource, amount in (used or {}).items():
        free[resource] -= size(amount)  # type: ignore[arg-type]
    free["gpus"] = gpus - len(gpu_used)
    return HostView(name, state, total, free, tuple(i for i in range(gpus) if i not in gpu_used), attrs,
                    frozenset(tags))


def job(n: int | tuple[int, int] = 1, R: str = "", id: int = 1) -> JobRequest:
    low, high = (n, n) if isinstance(n, int) else n
    return JobRequest(id, low, high, rr.parse(R))


def slots_only(*caps: int) -> list[HostView]:
    """Hosts h1, h2... with the given free slots (8 in total each)."""
    return [host(f"h{i}", slots=8, used={"slots": 8 - c}) for i, c in enumerate(caps, 1)]


def placed(result: Placement | Refusal) -> tuple[tuple[str, int], ...]:
    assert isinstance(result, Placement), result.summary()  # type: ignore[union-attr]
    return result.hosts
