"""What `placement.place` answers: a `Placement`, or a `Refusal` with its reasons, and their display.

A `Placement` says where the tasks go, what they reserve on each host and which GPUs they get. A
`Refusal` says why a job cannot start now: for every host that cannot take even one of its tasks,
every reason why (`HostRefusal`), plus the reasons that belong to the job as a whole (too few tasks
fit under its span rule, a shared counter is short).
`summary()` is the one-line form `xce jobs -p` shows; `details()` the per-host lines `xce why` shows.

Pure and immutable: every value is a frozen, hashable, picklable dataclass, so a refusal crosses the
process pool, can be compared with the last one stored (reasons are written only when they change),
and can be kept in a per-session cache and handed back whole on a hit (the XCE bug-1932 returned an
empty reason from its cache).

Amounts are in base units (bytes for sizes); `format_amount` prints sizes of the resources LSF
counts in megabytes (mem, swp, tmp...) with K/M/G/T, and everything else as a plain number.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass
from typing import Any

from xce_lite.sched import resreq as rr

Amount = int | float


def format_amount(resource: str, value: Amount) -> str:
    """`mem` 8589934592 -> "8G", 1610612736 -> "1.5G"; `gpus` 2 -> "2"; `lic` 0.5 -> "0.5"."""
    if rr.default_unit(resource) is None:
        return str(int(value)) if float(value).is_integer() else f"{value:g}"
    for unit, power in (("T", 4), ("G", 3), ("M", 2), ("K", 1)):
        scale = 1024**power
        if abs(value) >= scale:
            text = f"{value / scale:.2f}".rstrip("0").rstrip(".")
            return text + unit
    return "0" if value == 0 else f"{value:g}B"


class FrozenMap(Mapping[str, Any]):
    """An immutable, hashable, picklable mapping; keys kept sorted so equal maps print alike."""

    __slots__ = ("_d",)
    _d: dict[str, Any]  # set once, by __init__ (through object.__setattr__: the map is immutable)

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        object.__setattr__(self, "_d", dict(sorted(dict(items).items())))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FrozenMap is immutable")

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._d.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    # The dict's own methods and views (read-only), not the Mapping mixins' Python loops: a
    # session and the simulator's host rebuilds read 100,000s of these maps.
    def __contains__(self, key: object) -> bool:
        return key in self._d

    def keys(self) -> KeysView[str]:
        return self._d.keys()

    def items(self) -> ItemsView[str, Any]:
        return self._d.items()

    def values(self) -> ValuesView[Any]:
        return self._d.values()

    def shared_dict(self) -> dict[str, Any]:
        """The map's own dict, for reading at dict speed where a copy per read would cost (a
        scheduling session reads 1,000 hosts' free amounts). The caller must never change it."""
        return self._d

    def __eq__(self, other: object) -> bool:
        return self._d == dict(other.items()) if isinstance(other, Mapping) else NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._d.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def __reduce__(self) -> tuple[type, tuple[tuple[tuple[str, Any], ...]]]:
        return (FrozenMap, (tuple(self._d.items()),))


NOTHING = FrozenMap()


# ---------------------------------------------------------------- placements


@dataclass(frozen=True, slots=True)
class HostAlloc:
    """Tasks on one host, what they reserve there (base units, `slots` included, zeros left out),
    and the GPU indices they get (`CUDA_VISIBLE_DEVICES`)."""

    host: str
    tasks: int
    reserved: FrozenMap
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where job `job_id` runs: `allocs` first host first; `shared`: cluster counters it reserves."""

    job_id: int
    allocs: tuple[HostAlloc, ...]
    shared: FrozenMap = NOTHING

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        """((host, tasks), ...): the shape of core.Dispatch.hosts."""
        return tuple((a.host, a.tasks) for a in self.allocs)

    @property
    def tasks(self) -> int:
        return sum(a.tasks for a in self.allocs)


# ---------------------------------------------------------------- per host


@dataclass(frozen=True, slots=True)
class HostDown:
    """The host is closed by an admin or unreachable: no job goes there until that changes."""

    state: str

    def text(self) -> str:
        return self.state


@dataclass(frozen=True, slots=True)
class SelectFalse:
    """The host is not what the job's select asks for (canonical select text, without `select[]`)."""

    select: str

    def text(self) -> str:
        return f"does not match select[{self.select}]"


@dataclass(frozen=True, slots=True)
class Short:
    """One task does not fit: `needed` (per task + per host) is more than `free` (both base units)."""

    resource: str
    needed: Amount
    free: Amount

    def text(self) -> str:
        return f"{self.resource} needed {format_amount(self.resource, self.needed)}, " \
               f"free {format_amount(self.resource, self.free)}"


@dataclass(frozen=True, slots=True)
class NoValue:
    """The host has no value for an attribute named in `same[...]`, so it cannot join any group."""

    attr: str

    def text(self) -> str:
        return f"no {self.attr} for same[{self.attr}]"


HostReason = HostDown | SelectFalse | Short | NoValue


@dataclass(frozen=True, slots=True)
class HostRefusal:
    """Every reason `host` cannot take one task: its state alone, or its select alone, or the
    `same[]` attributes it lacks and the resources it is short of."""

    host: str
    reasons: tuple[HostReason, ...]


# ---------------------------------------------------------------- per job


@dataclass(frozen=True, slots=True)
class TooFewTasks:
    """Fewer than the job's minimum fit (`most` is what does fit), under its span and same rules."""

    min_tasks: int
    most: int
    span: str = ""  # canonical span text without `span[]`, "" when none
    same: tuple[str, ...] = ()

    def text(self) -> str:
        tasks = "task" if self.min_tasks == 1 else "tasks"
        fit = "none fit" if self.most == 0 else f"at most {self.most} fit"
        text = f"needs at least {self.min_tasks} {tasks}, {fit}"
        if self.span:
            text += f" with span[{self.span}]"
        if self.same:
            text += f" on hosts with the same {', '.join(self.same)}"
        return text


@dataclass(frozen=True, slots=True)
class NoTaskCount:
    """`span[block=b]` and `-n min,max` allow no task count: no multiple of b lies in the range."""

    min_tasks: int
    max_tasks: int
    block: int

    def text(self) -> str:
        return f"span[block={self.block}] needs a multiple of {self.block} tasks, " \
               f"and -n {self.min_tasks},{self.max_tasks} allows none"


@dataclass(frozen=True, slots=True)
class SharedShort:
    """A cluster-wide counter (a license) has less free than the job's minimum needs."""

    name: str
    needed: Amount
    free: Amount

    def text(self) -> str:
        return f"{self.name} needed {format_amount(self.name, self.needed)}, " \
               f"free {format_amount(self.name, self.free)} (shared by the cluster)"


@dataclass(frozen=True, slots=True)
class NoFirstHost:
    """Hosts could take tasks, but none could also hold the per-job rusage (given as rusage text)."""

    rusage: str

    def text(self) -> str:
        return f"no host can take a task plus the per-job rusage[{self.rusage}]"


@dataclass(frozen=True, slots=True)
class NoHosts:
    """The snapshot has no hosts at all."""

    def text(self) -> str:
        return "no hosts"


JobReason = TooFewTasks | NoTaskCount | SharedShort | NoFirstHost | NoHosts


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why job `job_id` cannot start now. `hosts` is sorted by host name and names only hosts that
    cannot take one task; `capacity` lists the others with the most tasks each could take alone
    (before span rules), so `xce why` can say what would let the job start."""

    job_id: int
    job_reasons: tuple[JobReason, ...]
    hosts: tuple[HostRefusal, ...] = ()
    capacity: tuple[tuple[str, int], ...] = ()

    def summary(self) -> str:
        """Job reasons first, then hosts grouped by the same reasons, largest group first:
        "needs at least 4 tasks, at most 2 fit; 3 hosts: mem needed 8G, free at most 4G; h2: closed".
        A `Short` groups on (resource, needed) and shows the most free in the group."""
        parts = [reason.text() for reason in self.job_reasons]
        groups: dict[tuple[object, ...], list[HostRefusal]] = {}
        for refusal in self.hosts:  # hundreds of hosts: no generator, no list made to be thrown away
            key = tuple(map(_shape, refusal.reasons))
            group = groups.get(key)
            if group is None:
                groups[key] = [refusal]
            else:
                group.append(refusal)
        for members in sorted(groups.values(), key=lambda g: (-len(g), g[0].host)):
            label = members[0].host if len(members) == 1 else f"{len(members)} hosts"
            texts = []
            for i, reason in enumerate(members[0].reasons):
                if isinstance(reason, Short) and len(members) > 1:
                    most = max(m.reasons[i].free for m in members)  # type: ignore[union-attr]
                    texts.append(f"{reason.resource} needed {format_amount(reason.resource, reason.needed)}, "
                                 f"free at most {format_amount(reason.resource, most)}")
                else:
                    texts.append(reason.text())
            parts.append(f"{label}: {', '.join(texts)}")
        return "; ".join(parts)

    def details(self) -> tuple[str, ...]:
        """One line per job reason, then one per host by name (refused hosts and hosts with room)."""
        lines = [reason.text() for reason in self.job_reasons]
        per_host = {r.host: ", ".join(x.text() for x in r.reasons) for r in self.hosts}
        for host, tasks in self.capacity:
            per_host[host] = f"can take {tasks} task{'' if tasks == 1 else 's'}"
        lines.extend(f"{host}: {text}" for host, text in sorted(per_host.items()))
        return tuple(lines)


def _shape(reason: HostReason) -> object:
    return ("short", reason.resource, reason.needed) if isinstance(reason, Short) else reason
