"""Faster pickling of the scheduler's values over the worker's pipe (sched_worker.py).

A session crosses the pipe twice, and its values' default pickling is most of its fixed cost:
slotted frozen dataclasses go through `dataclasses`' __getstate__/__setstate__ (a walk over the
fields each way) and a FrozenMap is sorted again when it is rebuilt. These reducers are registered
with multiprocessing's ForkingPickler, which the pipe's Connection uses, so plain `pickle` (the
decisions' hashes in bench/scheduling.py, anything stored) keeps the values' own form; any other
multiprocessing pipe of a process that imported sched_worker uses them too, harmlessly. The values
rebuilt are equal to the ones sent, field by field: the maps keep their (sorted) order.
"""

from __future__ import annotations

from typing import Any

from multiprocessing.reduction import ForkingPickler

from xce_lite.sched.placement import HostView
from xce_lite.sched.reasons import FrozenMap, HostAlloc, Placement


def _map(d: dict[str, Any]) -> FrozenMap:
    """A FrozenMap of a dict that came from one (sorted already): not sorted again."""
    m = object.__new__(FrozenMap)
    object.__setattr__(m, "_d", d)
    return m


def _reduce_map(m: FrozenMap) -> tuple[Any, tuple[Any, ...]]:
    return _map, (m.shared_dict(),)


def _host(name: str, state: str, total: FrozenMap, free: FrozenMap, gpu_free: tuple[int, ...],
          attrs: FrozenMap, tags: frozenset[str]) -> HostView:
    view = object.__new__(HostView)
    for field, value in (("name", name), ("state", state), ("total", total), ("free", free),
                         ("gpu_free", gpu_free), ("attrs", attrs), ("tags", tags)):
        object.__setattr__(view, field, value)
    return view


def _reduce_host(h: HostView) -> tuple[Any, tuple[Any, ...]]:
    return _host, (h.name, h.state, h.total, h.free, h.gpu_free, h.attrs, h.tags)


def _reduce_alloc(a: HostAlloc) -> tuple[Any, tuple[Any, ...]]:
    return HostAlloc, (a.host, a.tasks, a.reserved, a.gpus)


def _reduce_placement(p: Placement) -> tuple[Any, tuple[Any, ...]]:
    return Placement, (p.job_id, p.allocs, p.shared)


ForkingPickler.register(FrozenMap, _reduce_map)
ForkingPickler.register(HostView, _reduce_host)
ForkingPickler.register(HostAlloc, _reduce_alloc)
ForkingPickler.register(Placement, _reduce_placement)
