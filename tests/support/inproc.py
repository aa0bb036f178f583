"""A controller in-process for the controller's tests: a real home and store (a temp directory), the
real `Controller` with its seams set to fake hosts (exec/fake.py) behind `InlineLink`s, inline host
operations, the in-process scheduler and a fake clock. No thread runs: `step(dt)` moves the clock,
ends what the fake hosts end by then, and calls `tick(now)` itself.

Host loss is played as the real thing goes: `drop(host)` cuts the host's channel; after the lease
the fake host stops its units by itself (the agent's lease expiry, `lease_expired`), and `back(host)`
connects again. `restart()` closes the controller and builds a new one on the same store and
the same fake hosts (their units run on, as under a real supervisor).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from xce_lite.api.server import Caller
from xce_lite.controller.core import Controller
from xce_lite.controller.hostops import InlineHostOps
from xce_lite.controller.sched_worker import InlineScheduler
from xce_lite.controller.seams import FakeClock, InlineLink, Seams
from xce_lite.exec.fake import FakeCluster, sim_argv
from xce_lite.exec.link import HostDown
from xce_lite.home.paths import Home
from xce_lite.models import JobSpec

START = 1_700_000_000.0
LEASE_EXPIRED = "lease expired: no word from the controller"  # the agent's reason (agent/lease.py)


class _Link(InlineLink):
    """An inline link that cannot connect while the test holds its host cut off."""

    def __init__(self, inproc: InProc, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.inproc = inproc

    def start(self) -> None:
        if self.name in self.inproc.dropped:
            self.events.put(HostDown(self.name, "no route to host", self.generation))
        else:
            self.back()


class InProc:
    def __init__(self, hosts: tuple[str, ...] = ("h1", "h2"), slots: int = 2, extra: str = "",
                 host_lost_after: str = "40s", lease: str = "10s"):
        self.root = Path(tempfile.mkdtemp(prefix="xce-inproc-"))
        self.work = self.root / "work"
        self.work.mkdir()
        (self.root / "xce.yaml").write_text(textwrap.dedent("""\
            cluster: inproc
            hosts:
            """) + "".join(f"  - name: {h}\n    slots: {slots}\n    mem: 1G\n" for h in hosts)
            + textwrap.dedent(f"""\
            queues:
              - name: normal
                default: true
            controller:
              tick: 1s
              grace: 1s
              lease: {lease}
              host_lost_after: {host_lost_after}
              lease_margin: 5s
            """) + textwrap.dedent(extra))
        self.home = Home(self.root)
        self.clock = FakeClock(START)
        self.cluster = FakeCluster(now=START)
        self.hosts = {h: self.cluster.host(h) for h in hosts}
        self.dropped: dict[str, float] = {}  # host -> when its channel was cut
        self.logs: list[str] = []
        self.ctl = self._controller()

    def _controller(self) -> Controller:
        seams = Seams(clock=self.clock, host_factory=lambda config: (lambda: self.hosts[config.name]),
                      link_factory=lambda *a, **kw: _Link(self, *a, **kw), hostops_factory=InlineHostOps,
                      scheduler_factory=InlineScheduler)
        ctl = Controller(self.home, log=self.logs.append, seams=seams)
        ctl._load()
        ctl._hold_outside_projects(ctl.store.unfinished())
        for host_config in ctl.config.hosts:
            ctl._start_link(host_config)
        return ctl

    # ---- the clock -------------------------------------------------------------------------------

    def step(self, dt: float = 1.0) -> None:
        """Move the clock by `dt`, end what ends by then (and what a lost lease stops), tick."""
        now = self.clock.now + dt
        for name, since in self.dropped.items():
            if now - since >= self.ctl.config.controller.lease:
                for unit in list(self.hosts[name].units.values()):
                    if unit.result is None:
                        self.hosts[name].signal(unit.name, "TERM", LEASE_EXPIRED)
        self.cluster.advance(now)
        self.clock.now = now
        self.ctl.tick(now)

    # ---- requests, as the API takes them ---------------------------------------------------------

    def caller(self, user: str | None = None) -> Caller:
        return Caller(uid=os.getuid(), pid=os.getpid(), user=user or _me())

    def submit(self, runtime: float = 5.0, exit_code: int = 0, **fields: Any) -> int:
        spec = JobSpec(argv=sim_argv(runtime, exit_code), cwd=str(self.work), stdout=str(self.work / "out-%J"),
                       **fields)
        return self.ctl.api_submit(self.caller(), {}, {"jobs": [spec.to_wire()]})["ids"][0]

    def kill(self, job_id: int) -> dict:
        return self.ctl.api_kill(self.caller(), {}, {"ids": [str(job_id)]})["results"][0]

    def hold(self, job_id: int) -> dict:
        return self.ctl.api_hold(self.caller(), {}, {"ids": [str(job_id)]})["results"]

    def release(self, job_id: int) -> dict:
        return self.ctl.api_release(self.caller(), {}, {"ids": [str(job_id)]})["results"]

    # ---- faults ----------------------------------------------------------------------------------

    def drop(self, host: str) -> None:
        link = self.ctl._links[host]
        self.dropped[host] = self.clock.now
        self.hosts[host].events = None  # what it says now is lost, as on a dead channel
        link.drop()

    def back(self, host: str) -> None:
        self.dropped.pop(host, None)
        self.ctl._links[host].back()

    def restart(self) -> None:
        """The controller stops (no maintenance lease: as after a crash) and a new one starts."""
        for link in self.ctl._links.values():
            link.close()
        self.ctl.store.close()
        for host in self.hosts.values():
            host.events = None
        self.ctl = self._controller()

    # ---- looking -----------------------------------------------------------------------------------

    def job(self, job_id: int):
        return self.ctl.store.get(job_id)

    def live_units(self) -> dict[str, list[str]]:
        """host -> units running there now."""
        return {name: [u.name for u in h.units.values() if u.result is None] for name, h in self.hosts.items()}

    def close(self) -> None:
        for link in self.ctl._links.values():
            link.close()
        self.ctl.store.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
