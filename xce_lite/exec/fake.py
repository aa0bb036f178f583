"""Simulated hosts behind the exec seam: the Host contract (exec/host.py) on a clock the caller owns.

The simulator runs the controller's scheduler on simulated hosts; these are they. A `FakeCluster`
owns the simulated clock and one heap of unit ends for all its hosts; `FakeCluster.host(name)` is a
`FakeHost`, which keeps the seam's promises as a real host would, only in simulated time:

- A multi-host job's other units (role "host") run no program: they hold their share until
  signalled, as the agent's do.
- A unit's program is its argv: `("xce-sim-job", RUNTIME, EXIT_CODE)` "runs" RUNTIME seconds, then
  exits with EXIT_CODE (`sim_argv` builds it); any other argv is refused, as an exec failure would
  be. A `run_limit` shorter than the runtime ends the unit at the limit with TERM and the agent's
  reason ("run limit 00:10:00 reached"); `signal(unit, "TERM"/"KILL", reason)` ends it now.
- `launch` starts or adopts (a unit name is the fencing token: a repeated launch never runs a job
  twice); `launch_nowait` puts the replies on the events queue as one `UnitsLaunched`.
- Nothing ends by itself: `FakeCluster.advance(now)` moves the clock and finishes, in order of end
  time then launch order, every unit ending at or before `now`, each as a `UnitFinished` on its
  host's events queue. The result stays listed until `forget`. Deterministic: the same calls give
  the same events in the same order.

Chosen over a sim-side shortcut because the seam is cheap enough (a few dataclasses per unit: the
100,000-job bench spends well under a second here) and keeps the simulator honest about what a
host reports.
"""

from __future__ import annotations

import contextlib
import heapq
from dataclasses import dataclass, field

from xce_lite.exec.agent.util import format_limit
from xce_lite.exec.host import EventSink, HostEvent, HostProbe, JobResult, LaunchReply, LaunchRequest, UnitFinished, \
    UnitInfo, UnitsLaunched

PROGRAM = "xce-sim-job"
SIGNALS = {"TERM": 15, "KILL": 9}


def sim_argv(runtime: float, exit_code: int) -> tuple[str, ...]:
    """The argv of a simulated job that runs `runtime` seconds and exits `exit_code`."""
    return (PROGRAM, repr(float(runtime)), str(int(exit_code)))


@dataclass
class _Unit:
    host: str
    name: str
    start: float
    end: float
    exit_code: int | None
    signal: int | None
    reason: str | None
    seq: int
    result: JobResult | None = None


@dataclass
class FakeCluster:
    """The simulated clock and every fake host's running units."""

    now: float = 0.0
    _hosts: dict[str, FakeHost] = field(default_factory=dict)
    _ends: list[tuple[float, int, str, str]] = field(default_factory=list)  # (end, seq, host, unit)
    _seq: int = 0

    def host(self, name: str) -> FakeHost:
        found = self._hosts.get(name)
        if found is None:
            found = self._hosts[name] = FakeHost(name, self)
        return found

    def next_end(self) -> float | None:
        """When the next running unit ends, if any does."""
        while self._ends:
            end, _, host, unit = self._ends[0]
            u = self._hosts[host].units.get(unit)
            if u is not None and u.result is None and u.end == end:
                return end
            heapq.heappop(self._ends)  # ended early (signalled) or forgotten
        return None

    def advance(self, now: float) -> int:
        """Move the clock to `now` (never back) and finish every unit due; returns how many ended."""
        if now < self.now:
            raise ValueError(f"the simulated clock cannot go back from {self.now} to {now}")
        self.now = now
        ended = 0
        while (end := self.next_end()) is not None and end <= now:
            _, _, host, name = heapq.heappop(self._ends)
            self._hosts[host].finish(self._hosts[host].units[name])
            ended += 1
        return ended

    def _started(self, unit: _Unit) -> None:
        heapq.heappush(self._ends, (unit.end, unit.seq, unit.host, unit.name))


class FakeHost:
    """One simulated host (see the module docstring); `units` by name, in launch order."""

    def __init__(self, name: str, cluster: FakeCluster) -> None:
        self.name = name
        self.cluster = cluster
        self.units: dict[str, _Unit] = {}
        self.events: EventSink | None = None

    def connect(self, events: EventSink) -> HostProbe:
        self.events = events
        return HostProbe(hostname=self.name, cpus=0, mem=0, agent_version=0, extra={"fake": True})

    def launch(self, requests: list[LaunchRequest]) -> list[LaunchReply]:
        return [self._launch_one(r) for r in requests]

    def launch_nowait(self, requests: list[LaunchRequest]) -> None:
        self._put(UnitsLaunched(self.name, tuple(self.launch(requests))))

    def corked(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # nothing travels: each request takes effect as it is made

    def start_at(self, request: LaunchRequest, start: float) -> LaunchReply:
        """Launch as if at `start` (<= now): how a restored simulation puts back its running units."""
        return self._launch_one(request, start)

    def _launch_one(self, request: LaunchRequest, start: float | None = None) -> LaunchReply:
        known = self.units.get(request.unit)
        if known is not None:  # adopt, never run twice
            status = "finished" if known.result is not None else "running"
            return LaunchReply(request.unit, status, known.start)
        argv = request.argv
        if request.role == "host":  # a multi-host job's other unit: holds its share until signalled
            self.cluster._seq += 1
            begin = self.cluster.now if start is None else start
            self.units[request.unit] = _Unit(self.name, request.unit, begin, float("inf"), 0, None, None,
                                             self.cluster._seq)
            return LaunchReply(request.unit, "started", begin)
        if len(argv) != 3 or argv[0] != PROGRAM:
            return LaunchReply(request.unit, "refused", error=f"exec failed: {argv[0] if argv else ''!r} is not "
                                                             f"a simulated job (expected {PROGRAM} RUNTIME EXIT)")
        runtime = float(argv[1])
        exit_code: int | None = int(argv[2])
        begin = self.cluster.now if start is None else start
        signal, reason = None, None
        if request.run_limit is not None and runtime > request.run_limit:
            runtime, exit_code, signal = request.run_limit, None, SIGNALS["TERM"]
            reason = f"run limit {format_limit(request.run_limit)} reached"
        self.cluster._seq += 1
        unit = _Unit(self.name, request.unit, begin, begin + runtime, exit_code, signal, reason, self.cluster._seq)
        self.units[request.unit] = unit
        self.cluster._started(unit)
        return LaunchReply(request.unit, "started", begin)

    def finish(self, unit: _Unit) -> None:
        unit.result = JobResult(unit.exit_code, unit.signal, unit.start, unit.end, 0.0, 0, unit.reason)
        self._put(UnitFinished(self.name, unit.name, unit.result))

    def signal(self, unit: str, name: str, reason: str) -> bool:
        u = self.units.get(unit)
        if u is None or u.result is not None:
            return False
        if name in SIGNALS:
            u.end, u.exit_code, u.signal, u.reason = self.cluster.now, None, SIGNALS[name], reason
            self.finish(u)
        return True

    def list_units(self) -> list[UnitInfo]:
        return [UnitInfo(u.name, "finished" if u.result else "running", u.start, u.result)
                for u in self.units.values()]

    def forget(self, units: list[str], wait: bool = True) -> None:
        for name in units:
            u = self.units.get(name)
            if u is not None and u.result is not None:
                del self.units[name]

    def close(self) -> None:
        self.events = None

    def _put(self, event: HostEvent) -> None:
        if self.events is not None:
            self.events.put(event)
