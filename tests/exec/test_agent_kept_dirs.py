"""A reused supervisor's host directory kept from job to job (exec/agent/hostdirs.py), on real
processes: the next job gets the same directory renamed (not a mkdir), as a fresh one would be
(empty but for its hostfile, 0700), never with what a job left in it or did to it; and the kept
directory (SPOOL/units/.w-PID-START) goes with its worker, whether it leaves, is killed -9, or dies
with its agent (the next agent's zygote removes it)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support.agent_local import journal
from tests.support.procs import proc_field, zombie
from tests.support.raw_agent import py, unit
from tests.support.waiting import wait_until

# prints its host directory's inode, mode and listing; then does what argv[1] says to it
LOOK = (
    "import json, os, sys; d = os.environ['XCE_JOB_HOST_DIR']; st = os.lstat(d)\n"
    "print(json.dumps({'ino': st.st_ino, 'mode': st.st_mode & 0o7777, 'names': sorted(os.listdir(d)),\n"
    "                  'hostfile': open(d + '/hostfile').read()}), flush=True)\n"
    "if sys.argv[1] == 'leave': open(d + '/left', 'w').write('x')\n"
    "if sys.argv[1] == 'chmod': os.chmod(d, 0o755)\n"
)


def kept_dirs(spool: Path) -> list[str]:
    return sorted(p.name for p in (spool / "units").iterdir() if p.name.startswith(".w-"))


def run(agent, tmp_path: Path, name: str, then: str = "") -> dict:
    """Run the LOOK job `name` and forget it; what it printed, and `worker`: its supervisor's pid."""
    agent.launch(unit(name, py(LOOK, then or "-"), tmp_path, hostfile=f"{name} slots=1\n"))
    assert agent.finished(name)["exit_code"] == 0
    worker = journal(agent.spool)[name]["pid"]
    assert all(u["ok"] for u in agent.request("forget", units=[name])["units"])
    return {**json.loads((tmp_path / f"{name}.out").read_text()), "worker": worker}


def test_the_next_job_gets_the_kept_dir_renamed_and_nothing_of_the_job_before(agents, spool, tmp_path):
    agent = agents()
    first = run(agent, tmp_path, "a1")
    worker = first["worker"]
    start = proc_field(worker, 19)
    assert kept_dirs(spool) == [f".w-{worker}-{start}"]  # kept, empty, and no unit's directory left
    assert sorted(p.name for p in (spool / "units").iterdir()) == kept_dirs(spool)
    assert list((spool / "units" / kept_dirs(spool)[0]).iterdir()) == []
    second = run(agent, tmp_path, "a2", "leave")
    assert second["worker"] == worker
    assert second["ino"] == first["ino"]  # the same directory, renamed: no mkdir, no rmdir
    for got, name in ((first, "a1"), (second, "a2")):
        assert got["names"] == ["hostfile"] and got["mode"] == 0o700 and got["hostfile"] == f"{name} slots=1\n"
    third = run(agent, tmp_path, "a3", "chmod")  # the one a2 left a file in is not given to a3
    assert third["worker"] == worker
    assert third["names"] == ["hostfile"] and third["mode"] == 0o700
    fourth = run(agent, tmp_path, "a4")  # nor the one a3 opened to others
    assert fourth["worker"] == worker
    assert fourth["names"] == ["hostfile"] and fourth["mode"] == 0o700
    fifth = run(agent, tmp_path, "a5")  # a4's, untouched, is kept again
    assert fifth["ino"] == fourth["ino"] and fifth["names"] == ["hostfile"]
    assert len(kept_dirs(spool)) == 1 and list((spool / "units").iterdir()) == [spool / "units" / kept_dirs(spool)[0]]
    agent.close()  # the worker leaves at its agent's end, and its kept directory with it
    wait_until(lambda: zombie(worker), 10, "the worker to leave")
    assert kept_dirs(spool) == []


def test_a_kept_dir_goes_when_its_worker_is_killed_and_when_it_died_with_its_agent(agents, spool, tmp_path):
    agent = agents()
    worker = run(agent, tmp_path, "b1")["worker"]
    assert len(kept_dirs(spool)) == 1
    os.kill(worker, signal.SIGKILL)  # idle: the zygote reaps it, and removes what it kept
    wait_until(lambda: kept_dirs(spool) == [], 10, "the killed worker's kept directory to go")
    killed, worker = worker, run(agent, tmp_path, "b2")["worker"]
    assert worker != killed and len(kept_dirs(spool)) == 1
    zygote = int(proc_field(worker, 1))
    os.kill(worker, signal.SIGSTOP)  # it cannot leave (and remove it) at its agent's end
    for pid in (agent.proc.pid, zygote, worker):  # and none of them lives to remove it
        os.kill(pid, signal.SIGKILL)
    agent.proc.wait(10)
    for pid in (zygote, worker):
        wait_until(lambda pid=pid: zombie(pid), 10, "the zygote and the worker to die")
    assert len(kept_dirs(spool)) == 1
    again = agents()  # its zygote sweeps the kept directories of workers no longer alive
    last = run(again, tmp_path, "b3")["worker"]
    assert kept_dirs(spool) == [f".w-{last}-{proc_field(last, 19)}"]
