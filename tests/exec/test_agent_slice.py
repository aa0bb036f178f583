"""With XCE_AGENT_SLICE=1 the agent and its reused supervisors run with a short CPU slice
(exec/agent/cpuslice.py), and no job gets it: a job in a worker, a job in a fresh supervisor and
the zygote have the kernel's default, read from /proc/PID/sched (se.slice) as the kernel reports
it. Without it (the default), nothing changes."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.agent_local import journal
from tests.support.raw_agent import py, unit
from xce_lite.exec.agent.cpuslice import SLICE_NS

PRINT_SLICE = "print(next(l.split(':')[1].strip() for l in open('/proc/self/sched') if l.startswith('se.slice')))"


def slice_of(pid: int | str) -> int | None:
    try:
        with open(f"/proc/{pid}/sched") as f:
            return next((int(line.split(":")[1]) for line in f if line.startswith("se.slice")), None)
    except OSError:
        return None


DEFAULT = slice_of("self")


def test_the_agent_and_its_workers_have_the_short_slice_and_their_jobs_do_not(agents, spool, tmp_path: Path):
    # as tests/unit/test_api_slice.py: a kernel without slices (before 6.6) fails here, never skips
    assert DEFAULT is not None and DEFAULT != SLICE_NS, "the kernel reports no slice, or a short one by default"
    agent = agents(env={**os.environ, "XCE_AGENT_SLICE": "1"})
    for name in ("first", "second"):  # the second one in the worker the first made
        agent.launch(unit(name, py(PRINT_SLICE), tmp_path))
        assert agent.finished(name)["exit_code"] == 0
        assert int((tmp_path / f"{name}.out").read_text()) == DEFAULT
    worker = journal(spool)["second"]["pid"]
    assert journal(spool)["first"]["pid"] == worker
    assert slice_of(agent.proc.pid) == SLICE_NS and slice_of(worker) == SLICE_NS
    with open(f"/proc/{worker}/stat") as f:
        zygote = f.read().rsplit(")", 1)[1].split()[1]
    assert slice_of(zygote) == DEFAULT  # forked before the agent asked, and it passes nothing on
    # a unit with supervisor hooks gets a fresh supervisor from the zygote: the default, and its job too
    hook = {"point": "pre_job_exec", "layer": "job", "argv": ["true"], "timeout": 10}
    hooked = unit("hooked", py(PRINT_SLICE), tmp_path, hooks=[hook])
    agent.launch(hooked)
    assert agent.finished("hooked")["exit_code"] == 0
    assert int((tmp_path / "hooked.out").read_text().splitlines()[-1]) == DEFAULT


def test_without_the_switch_the_agent_and_its_workers_keep_the_default(agents, spool, tmp_path: Path):
    agent = agents(env={k: v for k, v in os.environ.items() if k != "XCE_AGENT_SLICE"})
    agent.launch(unit("plain", py(PRINT_SLICE), tmp_path))
    assert agent.finished("plain")["exit_code"] == 0
    worker = journal(spool)["plain"]["pid"]
    assert slice_of(agent.proc.pid) == DEFAULT and slice_of(worker) == DEFAULT
