"""A controller in-process for the controller's tests: `Controlled` (xce_lite/sim/controlled.py, the
simulator's own) on a fresh home in a temp directory, with a config this module writes. No thread
runs: `step(dt)` moves the clock, ends what the fake hosts end by then, and calls `tick(now)`.
What it adds for tests: the config from arguments, and `submit` of a simulated job by runtime.
"""

from __future__ import annotations

import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from xce_lite.controller.sched_worker import InlineScheduler
from xce_lite.exec.fake import sim_argv
from xce_lite.models import JobSpec
from xce_lite.sim.controlled import LEASE_EXPIRED, Controlled
from xce_lite.store.jobs import JobStore

START = 1_700_000_000.0
__all__ = ["LEASE_EXPIRED", "START", "InProc"]


class InProc(Controlled):
    def __init__(self, hosts: tuple[str, ...] = ("h1", "h2"), slots: int = 2, extra: str = "",
                 host_lost_after: str = "40s", lease: str = "10s", applications: str = "",
                 store_class: type[JobStore] = JobStore, scheduler_factory: Any = InlineScheduler):
        root = Path(tempfile.mkdtemp(prefix="xce-inproc-"))
        if applications:
            (root / "applications.yaml").write_text(textwrap.dedent(applications))
        self.work = root / "work"
        self.work.mkdir()
        (root / "xce.yaml").write_text(textwrap.dedent("""\
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
        super().__init__(root, START, store_class=store_class, scheduler_factory=scheduler_factory)

    def submit(self, runtime: float = 5.0, exit_code: int = 0, **fields: Any) -> int:
        spec = JobSpec(argv=sim_argv(runtime, exit_code), cwd=str(self.work), stdout=str(self.work / "out-%J"),
                       **fields)
        return self.submit_spec(spec)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.root, ignore_errors=True)
