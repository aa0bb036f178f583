"""The real controller in-process: its own tick on fake hosts (exec/fake.py) and a fake clock.

`Controlled(root)` starts the real `Controller` on the home at `root` (its xce.yaml is read as the
daemon reads it) with its seams set to fake hosts behind `InlineLink`s, inline host operations, the
in-process scheduler and a `FakeClock`. No thread runs: `advance(now)` moves the clock, stops what a
lost host's lease stops, ends what the fake hosts end by then, and calls `tick(now)`. The simulator
(sim/ticked.py) and the controller's tests (tests/support/inproc.py) both drive it: one copy.

Host loss is played as the real thing goes: `drop(host)` cuts the host's channel (what it says is
lost); once the lease has run out the fake host stops its units by itself (the agent's reason,
LEASE_EXPIRED); `back(host)` connects again. `restart()` builds a new controller on the same store
and the same fake hosts (their units run on, as under a real supervisor).

Invariants: time is only `self.clock.now`, which never goes back; requests go through the API's
own handlers (`api_submit`...), so a job is in the store before its id is returned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from xce_lite.api.caller import Caller
from xce_lite.controller.core import Controller
from xce_lite.controller.hostops import InlineHostOps
from xce_lite.controller.sched_worker import InlineScheduler
from xce_lite.controller.seams import FakeClock, InlineLink, Seams
from xce_lite.exec.fake import FakeCluster
from xce_lite.exec.link import HostDown
from xce_lite.home.paths import Home
from xce_lite.models import JobSpec
from xce_lite.store.jobs import JobStore

LEASE_EXPIRED = "lease expired: no word from the controller"  # the agent's reason (agent/lease.py)


class _Link(InlineLink):
    """An inline link that cannot connect while its host is held cut off."""

    def __init__(self, owner: Controlled, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.owner = owner

    def start(self) -> None:
        if self.name in self.owner.dropped:
            self.events.put(HostDown(self.name, "no route to host", self.generation))
        else:
            self.back()


class Controlled:
    """See the module docstring. `durable=False`: the store commits without fsync (a simulation's
    throwaway store; the controller's tests keep the real setting)."""

    def __init__(self, root: Path, start: float, log: Any = None, durable: bool = True,
                 scheduler_factory: Any = InlineScheduler, store_class: type[JobStore] = JobStore) -> None:
        self.root = Path(root)
        self.home = Home(self.root)
        self.durable = durable
        self.scheduler_factory, self.store_class = scheduler_factory, store_class
        self.clock = FakeClock(start)
        self.cluster = FakeCluster(now=start)
        self.dropped: dict[str, float] = {}  # host -> when its channel was cut
        self.logs: list[str] = []
        self.log = log or self.logs.append
        self.ctl = self._controller()
        self.hosts = {h.name: self.cluster.host(h.name) for h in self.ctl.config.hosts}

    def _controller(self) -> Controller:
        self.home.spool.mkdir(mode=0o700, exist_ok=True)
        store = self.store_class(self.home.store, durable=self.durable)
        seams = Seams(clock=self.clock, store=store,
                      host_factory=lambda config: (lambda: self.cluster.host(config.name)),
                      link_factory=lambda *a, **kw: _Link(self, *a, **kw), hostops_factory=InlineHostOps,
                      scheduler_factory=self.scheduler_factory, prefill=False, end_waits=False)
        ctl = Controller(self.home, log=self.log, seams=seams)
        ctl._load()
        ctl._hold_outside_projects(ctl.store.unfinished())
        for host_config in ctl.config.hosts:
            ctl._start_link(host_config)
        return ctl

    # ---- the clock -------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Move the clock to `now`, end what ends by then (and what a lost lease stops), tick."""
        if now < self.clock.now:
            raise ValueError(f"the clock cannot go back from {self.clock.now} to {now}")
        lease = self.ctl.config.controller.lease
        for name, since in self.dropped.items():
            if now - since >= lease:
                self.cluster.advance(max(self.cluster.now, min(now, since + lease)))
                host = self.cluster.host(name)
                for unit in [u for u in host.units.values() if u.result is None]:
                    host.signal(unit.name, "TERM", LEASE_EXPIRED)
        self.cluster.advance(now)
        self.clock.now = now
        self.ctl.state.wake.clear()
        self.ctl.tick(now)

    def step(self, dt: float = 1.0) -> None:
        self.advance(self.clock.now + dt)

    @property
    def wants_tick(self) -> bool:
        """The controller asked to be woken (an event arrived, work is left for the next pass)."""
        return self.ctl.state.wake.is_set() or not self.ctl._events.empty()

    # ---- requests, as the API takes them ---------------------------------------------------------

    def caller(self, user: str | None = None) -> Caller:
        return Caller(uid=os.getuid(), pid=os.getpid(), user=user or _me())

    def submit_spec(self, spec: JobSpec, user: str | None = None) -> int:
        return self.ctl.api_submit(self.caller(user), {}, {"jobs": [spec.to_wire()]})["ids"][0]

    def submit_specs(self, specs: list[JobSpec], user: str | None = None) -> list[int]:
        """One request of several jobs (all or nothing, one commit), as `xce flow submit` sends."""
        return self.ctl.api_submit(self.caller(user), {}, {"jobs": [s.to_wire() for s in specs]})["ids"]

    def submit_wires(self, wires: list[dict], user: str | None = None) -> list[int]:
        """`submit_specs` of specs in their wire form already (the simulator makes each shape once)."""
        return self.ctl.api_submit(self.caller(user), {}, {"jobs": wires})["ids"]

    def kill(self, job_id: int) -> dict:
        return self.ctl.api_kill(self.caller(), {}, {"ids": [str(job_id)]})["results"][0]

    def hold(self, job_id: int) -> dict:
        return self.ctl.api_hold(self.caller(), {}, {"ids": [str(job_id)]})["results"]

    def release(self, job_id: int) -> dict:
        return self.ctl.api_release(self.caller(), {}, {"ids": [str(job_id)]})["results"]

    # ---- faults ----------------------------------------------------------------------------------

    def drop(self, host: str) -> None:
        if host in self.dropped:
            return
        self.dropped[host] = self.clock.now
        self.cluster.host(host).events = None  # what it says now is lost, as on a dead channel
        self._link(host).drop()

    def back(self, host: str) -> None:
        if self.dropped.pop(host, None) is not None:
            self._link(host).back()

    def _link(self, host: str) -> InlineLink:
        link = self.ctl.state.links[host]
        assert isinstance(link, InlineLink)  # the seams this class gave the controller
        return link

    def restart(self) -> None:
        """The controller stops (no maintenance lease: as after a crash) and a new one starts."""
        for link in self.ctl.state.links.values():
            link.close()
        self.ctl.store.close()
        for host in self.hosts.values():
            host.events = None
        self.ctl = self._controller()

    # ---- looking ---------------------------------------------------------------------------------

    def job(self, job_id: int):
        return self.ctl.store.get(job_id)

    def counts(self) -> tuple[int, int]:
        """(pending, running): PEND jobs (the scheduler's set and those waiting at the gate), and
        jobs dispatched or running."""
        ctl = self.ctl
        return len(ctl.state.pending) + len(ctl.gating.gate) - len(ctl.gating.gate.fed), len(ctl.state.active)

    def live_reason(self, job_id: int) -> str | None:
        """The pend reason the controller holds now (the API's; the store gets it at most once a second)."""
        return self.ctl.state.reasons.get(job_id)

    def host_views(self) -> list:
        """Every host as the scheduler sees it now (sched.placement.HostView: free and total amounts)."""
        with self.ctl.state.mu:
            return list(self.ctl._hosts_now())

    def jobs_on(self) -> dict[str, int]:
        """host -> the dispatched or running jobs holding something there."""
        found: dict[str, int] = {}
        for job in self.ctl.state.active.values():
            for host in {a.host for a in job.holding.allocs}:
                found[host] = found.get(host, 0) + 1
        return found

    def loss_to_come(self) -> bool:
        """A host is out of reach and the controller has not yet declared it lost while it holds jobs."""
        ctl = self.ctl
        return any(name not in ctl.state.lost_hosts and any(a.host == name for j in ctl.state.active.values()
                                                       for a in j.holding.allocs)
                   for name in self.dropped)

    def live_units(self) -> dict[str, list[str]]:
        """host -> units running there now."""
        return {name: [u.name for u in h.units.values() if u.result is None] for name, h in self.hosts.items()}

    def close(self) -> None:
        for link in self.ctl.state.links.values():
            link.close()
        self.ctl.store.close()


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
