"""The decision trace: how the scheduler thought about a traced job, bounded, stored, and written out.

`render(examined, step, level)` turns one `core.Examined` into lines. At `full` level:

    trace step 3 t=120 session 2 job 7: -n 64 on queue normal, rusage[mem=2G] span[ptile=16]
      no plan: needs at least 64 tasks, at most 48 fit with span[ptile=16]
      candidates: 1000 hosts, 12 with room, 988 rejected
        h001: can take 8 tasks
        h0007: resource short: mem needed 8G, free 4G
        ...
      ... 962 more hosts not shown: 12 with room, 900 resource short, 50 select false
      pend reason: <the reason the job records>

one line per candidate host, hosts with room first, then by the rule that rejected each (select
false, resource short with needed vs free, same, closed), by name; a dispatch lists the plan's hosts
and what each reserves; a request an earlier job proved unsatisfiable in the same session says
"no plan generated: skipped, same request as job N proved unsatisfiable earlier this session"; a
queue limit, a reservation or a blocked job says which. A record never exceeds FULL_LINES lines:
past it, one line gives the exact count of hosts left out, per rule. `summary` level is one line.

`TraceStore` keeps rendered records for `info trace` within `byte_bound` (64 MiB), evicting the
oldest first, never the newest. `TraceFiles` opens trace files for appending when a command names
them and closes each when no trace setting holds it any more; `close_all` flushes and closes.
Nothing here can reach a decision: it only reads what the core's observer handed over.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from dataclasses import dataclass
from typing import IO

from xce_lite.sched import core
from xce_lite.sched import resreq as rr
from xce_lite.sched.reasons import HostDown, NoValue, Placement, Refusal, SelectFalse, Short, format_amount

FULL, SUMMARY = "full", "summary"
FULL_LINES = 40  # the most lines one full record has
SUMMARY_HOSTS = 8  # hosts a one-line dispatch names before "+N more"
BYTE_BOUND = 64 * 1024 * 1024
_RULES = ("with room", "select false", "resource short", "same", "closed", "unreachable")


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _rule(reasons: tuple) -> str:
    first = reasons[0] if reasons else None
    if isinstance(first, HostDown):
        return first.state if first.state in _RULES else "closed"
    if isinstance(first, SelectFalse):
        return "select false"
    if any(isinstance(r, Short) for r in reasons):
        return "resource short"
    return "same" if any(isinstance(r, NoValue) for r in reasons) else "rejected"


def _host_line(reasons: tuple) -> str:
    rule = _rule(reasons)
    texts = ", ".join(r.text() for r in reasons if not isinstance(r, HostDown))
    return rule if rule in ("closed", "unreachable") else f"{rule}: {texts}"


def _request(e: core.Examined) -> str:
    r = e.request
    tasks = f"-n {r.min_tasks}" + (f",{r.max_tasks}" if r.max_tasks != r.min_tasks else "")
    text = rr.format(r.resreq)
    return tasks + (f", {text}" if text else "")


def render(e: core.Examined, step: int, t: float, session: int | None, level: str) -> list[str]:
    """The lines of one traced decision (module docstring)."""
    where = f"step {step} t={t:g} session {session} job {e.job_id}"
    if level == SUMMARY:
        return [f"trace {where}: {_one_line(e)}"]
    lines = [f"trace {where}: {_request(e)}"]
    body: list[str] = []
    if e.kind == core.DISPATCHED:
        p: Placement = e.outcome  # type: ignore[assignment]
        lines.append(f"  plan: {_count(len(p.allocs), 'host')}, {_count(p.tasks, 'task')}")
        body = [f"    {a.host}: {_count(a.tasks, 'task')}"
                + "".join(f", {k} {format_amount(k, v)}" for k, v in a.reserved.items() if k != "slots")
                + (f", gpu indices {','.join(map(str, a.gpus))}" if a.gpus else "") for a in p.allocs]
        counts = {"in the plan": len(body)}
        tail: list[str] = []
    else:
        if e.kind == core.REFUSED:
            refusal: Refusal = e.outcome  # type: ignore[assignment]
            lines.extend(f"  no plan: {r.text()}" for r in refusal.job_reasons)
            rows = [(0, h, f"can take {_count(n, 'task')}", "with room") for h, n in refusal.capacity]
            rows += [(1 + _RULES.index(_rule(r.reasons)) if _rule(r.reasons) in _RULES else 9, r.host,
                      _host_line(r.reasons), _rule(r.reasons)) for r in refusal.hosts]
            rows.sort(key=lambda row: (row[0], row[1]))
            lines.append(f"  candidates: {len(rows)} hosts, {len(refusal.capacity)} with room, "
                         f"{len(refusal.hosts)} rejected")
            body = [f"    {host}: {text}" for _, host, text, _ in rows]
            counts_rows = [rule for *_, rule in rows]
        elif e.kind == core.KNOWN_UNSAT:
            lines.append(f"  no plan generated: skipped, same request as job {e.proved_by} proved unsatisfiable "
                         f"earlier this session")
        elif e.kind == core.LIMITED:
            lines.append(f"  queue limit: {e.reason}")
        elif e.kind == core.BEHIND:
            lines.append(f"  reservation: {e.reason}")
        else:
            lines.append(f"  blocked: {e.reason}")
        if e.reserved:
            lines.append("  it now holds a reservation: later jobs wait until it starts")
        tail = [f"  pend reason: {e.reason}"]
    room = FULL_LINES - len(lines) - len(tail)
    if len(body) > room:
        shown = room - 1
        left = body[shown:]
        if e.kind == core.DISPATCHED:
            counts = {"in the plan": len(left)}
        else:
            counts = {}
            for rule in counts_rows[shown:]:
                counts[rule] = counts.get(rule, 0) + 1
        body = body[:shown] + [f"  ... {len(left)} more hosts not shown: "
                               + ", ".join(f"{n} {rule}" for rule, n in counts.items())]
    return lines + body + tail


def _one_line(e: core.Examined) -> str:
    if e.kind == core.DISPATCHED:
        p: Placement = e.outcome  # type: ignore[assignment]
        hosts = " ".join(f"{a.host}*{a.tasks}" for a in p.allocs[:SUMMARY_HOSTS])
        more = f" +{len(p.allocs) - SUMMARY_HOSTS} more hosts" if len(p.allocs) > SUMMARY_HOSTS else ""
        return f"dispatched, {p.tasks} tasks on {hosts}{more}"
    if e.kind == core.KNOWN_UNSAT:
        return f"pends (no plan generated: same request as job {e.proved_by}): {e.reason}"
    return f"pends: {e.reason}"


@dataclass(frozen=True)
class Record:
    step: int
    job_id: int
    text: str  # the rendered lines, joined with newlines


class TraceStore:
    """Rendered records within `byte_bound`, oldest evicted first (never the one just added)."""

    OVERHEAD = 160  # bytes a Record and its deque slot cost beyond the text itself

    def __init__(self, byte_bound: int = BYTE_BOUND) -> None:
        self.byte_bound = byte_bound
        self.records: deque[Record] = deque()
        self.bytes = 0
        self.evicted = 0

    def add(self, record: Record) -> None:
        self.records.append(record)
        self.bytes += sys.getsizeof(record.text) + self.OVERHEAD
        while self.bytes > self.byte_bound and len(self.records) > 1:
            old = self.records.popleft()
            self.bytes -= sys.getsizeof(old.text) + self.OVERHEAD
            self.evicted += 1

    def of(self, job_id: int | None = None) -> list[Record]:
        return [r for r in self.records if job_id is None or r.job_id == job_id]


@dataclass(frozen=True)
class TraceSettings:
    jobs: frozenset[int] | None  # None: every job
    level: str = SUMMARY
    file: tuple[int, int] | None = None  # the trace file's (device, inode), held in TraceFiles

    def wants(self, job_id: int) -> bool:
        return self.jobs is None or job_id in self.jobs


class TraceFiles:
    """Trace files by (device, inode), each open for appending while a setting holds it."""

    def __init__(self) -> None:
        self.files: dict[tuple[int, int], tuple[IO[str], int]] = {}

    def acquire(self, path: str, forbidden: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """Open `path` for appending (or hold it again); OSError or ValueError (what is wrong and
        what to do) if it cannot be opened or is one of `forbidden` (a label -> (device, inode))."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            for label, key in forbidden.items():
                if key == (st.st_dev, st.st_ino):
                    raise ValueError(f"{path} is the {label}; give the trace another file")
            known = self.files.get((st.st_dev, st.st_ino))
            if known is not None:
                self.files[(st.st_dev, st.st_ino)] = (known[0], known[1] + 1)
                return (st.st_dev, st.st_ino)
        out = open(path, "a", encoding="utf-8")  # held until released
        st = os.fstat(out.fileno())
        self.files[(st.st_dev, st.st_ino)] = (out, 1)
        return (st.st_dev, st.st_ino)

    def release(self, key: tuple[int, int] | None) -> None:
        if key is None or key not in self.files:
            return
        out, holders = self.files[key]
        if holders <= 1:
            del self.files[key]
            out.close()
        else:
            self.files[key] = (out, holders - 1)

    def write(self, key: tuple[int, int] | None, text: str) -> None:
        if key is not None and key in self.files:
            self.files[key][0].write(text)

    def is_open(self, path: str) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) in self.files

    def close_all(self) -> None:
        for out, _ in self.files.values():
            out.close()
        self.files.clear()
