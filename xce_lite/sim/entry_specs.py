"""A workload entry as the simulator submits it: its JobSpec and that spec's wire form (the body of
`POST /jobs`), made once per shape of entry (all its fields but its row, time and user): a
simulation of 100,000 jobs has a few hundred shapes. The API reads a request's specs and never
changes them, so one wire form serves every request that carries it.
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from pathlib import Path

from xce_lite.exec.fake import sim_argv
from xce_lite.models import JobSpec
from xce_lite.sim.workload import WorkloadJob
from xce_lite.workflow.arrays import ArraySpec

# an entry's shape: every field of it but where it is in the file, when, and whose (a field added to
# WorkloadJob is part of the shape without a change here)
_shape = attrgetter(*(f.name for f in fields(WorkloadJob) if f.name not in ("row", "submit", "user")))


class EntrySpecs:
    def __init__(self, work: Path) -> None:
        """`work`: the jobs' working directory (their output files go there too)."""
        self.work = work
        self._made: dict[tuple, tuple[JobSpec, dict]] = {}  # an entry's shape -> its spec and wire form

    def of(self, entry: WorkloadJob) -> tuple[JobSpec, dict]:
        key = _shape(entry)
        made = self._made.get(key)
        if made is None:
            spec = self.spec(entry)
            made = self._made[key] = (spec, spec.to_wire())
        return made

    def spec(self, entry: WorkloadJob) -> JobSpec:
        return JobSpec(argv=sim_argv(entry.runtime, entry.exit_code), cwd=str(self.work),
                       stdout=str(self.work / "out-%J"), name=entry.name, queue=entry.queue,
                       slots=entry.slots, max_slots=entry.max_slots, resreq=entry.resreq, run_limit=entry.run_limit,
                       mem_limit=entry.mem_limit, priority=entry.priority, app=entry.app, project=entry.project,
                       depend=entry.after, retry=entry.retry,
                       array=ArraySpec(entry.array[1], entry.array[2]).text() if entry.array else None)
