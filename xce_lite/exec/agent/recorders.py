"""Where a supervisor records its unit: the spool's journal (forked by `serve`, or inside a systemd
unit) or files in UNIT_DIR (`exec UNIT_DIR` on a spec without a spool). Each records a result
however the job ends; a result is durable (fdatasync'ed) before the supervisor exits 0 (a reused
supervisor's, pool.py, once the agent has synced it or as the worker exits)."""

from __future__ import annotations

import os

from .journal import JOURNAL, SharedAppender, append_shared, journal_kill_reason, record
from .jsonl import dumps
from .runas import remove_unit_dir
from .util import poke, private_file, read_text, write_file


class JournalRecorder:
    """Where a supervisor forked by `serve` records its unit: the spool's journal. With `appender`
    (a reused supervisor's, pool.py) its records go through that journal fd kept open, and its
    result is appended without a sync: the agent syncs it before it reports it (pool.py)."""

    def __init__(self, spool: str, unit: str, boot: str, appender: SharedAppender | None = None):
        self.spool, self.unit, self.boot, self.appender = spool, unit, boot, appender
        self.path = os.path.join(spool, JOURNAL)

    def append(self, data: bytes, sync: bool) -> None:
        if self.appender is not None:
            self.appender.append(data, sync)
        else:
            append_shared(self.path, data, sync)

    def started(self, pid: int, starttime: int, start_time: float, job: int) -> None:
        self.append(record("started", unit=self.unit, pid=pid, starttime=starttime, boot=self.boot, job=job), False)

    def finished(self, result: dict, by_itself: bool = True) -> None:
        self.append(record("finished", unit=self.unit, result=result), self.appender is None)

    def task_finished(self, launch_id: str, index: int, status: int | None, error: str | None = None) -> None:
        """A task of `xce launch` ended (`status` as from waitpid), or never started (`error`)."""
        code = None if status is None else os.waitstatus_to_exitcode(status)
        fields = {"unit": self.unit, "launch_id": launch_id, "index": index}
        fields.update(exit_code=None if code is None or code < 0 else code, signal=-code if code and code < 0 else None)
        self.append(record("task_finished", **fields, error=error), False)
        poke(self.spool)

    def kill_reason(self) -> str | None:
        """The reason of this unit's last `kill_requested` since its last `launched` (this launch).

        The whole journal is read, so that a compaction in between cannot hide a record; it is
        done once per kill, and the journal is small (compacted past --journal-limit).
        """
        return journal_kill_reason(self.path, self.unit)

    def error_log(self) -> str:
        return private_file(os.path.join(self.spool, "supervisor-errors.log"))


class UnitRecorder(JournalRecorder):
    """Where a supervisor inside a systemd unit records it: `started` and task ends in the journal.

    Its result: when the job ended by itself (no kill began: no request, no stop from systemd, and
    no OOM kill in the unit's cgroup where systemd enforces the memory limit), systemd has nothing
    to add (it will say `success`, as the supervisor exits 0), so the supervisor appends THE
    finished record itself, fdatasync'ed, and removes UNIT_DIR, which tells the unit's
    ExecStopPost that it has nothing to do: one Python interpreter per unit instead of two
    (measured here: ~14 ms of CPU each). Otherwise it writes UNIT_DIR/result.json, which `post`
    merges with what systemd says; always, when the unit has hooks (`post` runs its post hooks).
    Not fsynced: `post` reads it at once, and after an OS crash a unit of the old boot is lost
    whatever it wrote.
    """

    def __init__(self, spool: str, unit: str, boot: str, unit_dir: str, systemd_memory: bool, hooks: bool):
        super().__init__(spool, unit, boot)
        self.unit_dir, self.systemd_memory, self.hooks = unit_dir, systemd_memory, hooks

    def finished(self, result: dict, by_itself: bool = True) -> None:
        if by_itself and not self.hooks and not (self.systemd_memory and oom_kills() > 0):
            result["service_result"] = "success"
            inode, end = append_shared(self.path, record("finished", unit=self.unit, result=result), sync=True)
            remove_unit_dir(self.unit_dir)
            poke(self.spool, synced=[inode, end])
        else:
            write_file(os.path.join(self.unit_dir, "result.json"), dumps(result))


class DirRecorder:
    """Where a supervisor run by `exec UNIT_DIR` on a spec without a spool records its unit: files in
    UNIT_DIR (for a service manager of its own, without an agent).

    supervisor.pid: "PID STARTTIME START_EPOCH" and, on line 2, the job's pid; result.json, written
    atomically and durably; kill_reason, read when the supervisor is asked to kill its job.
    """

    def __init__(self, unit_dir: str):
        self.unit_dir = unit_dir

    def started(self, pid: int, starttime: int, start_time: float, job: int) -> None:
        text = f"{pid} {starttime} {start_time!r}\n{job}\n"
        write_file(os.path.join(self.unit_dir, "supervisor.pid"), text.encode())

    def finished(self, result: dict, by_itself: bool = True) -> None:
        write_file(os.path.join(self.unit_dir, "result.json"), dumps(result), durable=True)

    def task_finished(self, launch_id: str, index: int, status: int | None, error: str | None = None) -> None:
        pass  # tasks come from an agent, which this unit has not

    def kill_reason(self) -> str | None:
        return read_text(os.path.join(self.unit_dir, "kill_reason"))

    def error_log(self) -> str:
        return private_file(os.path.join(self.unit_dir, "supervisor.log"))


def oom_kills() -> int:
    """OOM kills counted in this process's memory cgroup: `post` runs in its unit's. cgroup v1's
    memory hierarchy first (hybrid hosts have their memory controller there), then v2's."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _counter(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control", "oom_kill")
    for line in lines:
        if line.startswith("0::"):
            return _counter(f"/sys/fs/cgroup{line[3:].rstrip('/')}/memory.events", "oom_kill")
    return 0


def _counter(path: str, name: str) -> int:
    """The value of the `name N` line of a cgroup file, 0 if there is none."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0
