"""The agent's units (a part of the Agent, server.py): the journal it serves and keeps folded in
memory, and each unit's status: running, finished, or lost (and then recorded so).

Invariants: the first `finished` record of a unit is its result; a result is durable before a line
that carries it is written (reported() and flush); a unit is judged lost only when nothing can run
it (no live supervisor, systemd does not know it, START_GRACE over).
"""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .link import ManagerLink
    from .shared import AgentState

import fcntl
import os
import sys
import time

from .journal import JOURNAL_VERSION, Unit, fold, record
from .jsonl import dumps
from .signals import signal
from .tree import kill_lost_session
from .runas import remove_unit_dir
from .util import fsync_dir, is_alive, make_result, proc_stat, write_all

# Seconds a unit launched by another agent (now gone) may be unknown to systemd before it counts as
# lost: that agent's StartTransientUnit may still lie unread in the manager's socket buffer.
START_GRACE = 10.0

Status = tuple[str, float | None, dict | None, int | None]  # (status, start_time, result, supervisor pid)


class UnitState:
    """The journal and the units' state (both in `state`); `link` asks systemd about its units."""

    def __init__(self, state: AgentState, link: ManagerLink):
        self.state, self.link = state, link
        self.settle = lambda pid: True  # the Agent sets pool.Workers.settle: a worker's "i" before its signals

    # -- the journal

    def open_journal(self) -> int:
        """Open the journal for appending and reading; a new one is made durable, name included
        (with the spool's own name: fdatasync'ed records are worth nothing in a file that an OS
        crash can unlink)."""
        s = self.state
        fd = os.open(s.journal_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if os.fstat(fd).st_size == 0:
            write_all(fd, record("journal", version=JOURNAL_VERSION), s.journal_path)
            os.fsync(fd)
            fsync_dir(s.spool)
            fsync_dir(os.path.dirname(s.spool))
        return fd

    def append(self, data: bytes, sync: bool = False) -> None:
        """Append the agent's own records, then apply everything new. No flock: only the agent
        replaces the file, so its fd always names the journal."""
        s = self.state
        start = s.offset
        write_all(s.jfd, data, s.journal_path)
        if sync:
            end = os.lseek(s.jfd, 0, os.SEEK_CUR)  # just past our write
            os.fdatasync(s.jfd)
            s.synced = max(s.synced, end)
        self.catch_up(data if data.endswith(b"\n") else None, start)

    def sync(self) -> None:
        """Make everything appended so far durable."""
        s = self.state
        size = os.fstat(s.jfd).st_size
        os.fdatasync(s.jfd)
        s.synced = max(s.synced, size)
        s.need_sync = False

    def catch_up(self, mine: bytes | None = None, at: int = -1) -> None:
        """Apply the records appended since the last call (up to the last complete line), and act
        on the news: report a watched unit's result, deliver signals held for a supervisor that
        has now started, report task ends. `mine`: what the agent itself appended at offset `at`;
        when the file holds exactly that beyond what was applied, it is not read back."""
        s = self.state
        size = os.fstat(s.jfd).st_size
        if size <= s.offset:
            return
        if mine is not None and at == s.offset and size == at + len(mine):
            data = mine  # nobody else appended before or after it: what we wrote is what is there
        else:
            data = os.pread(s.jfd, size - s.offset, s.offset)
        end = data.rfind(b"\n") + 1
        news = s.news
        fold(s.units, data[:end], s.offset, news, s.queued, s.left)
        s.offset += end
        if not news:
            return
        for rec in news:
            unit, event = rec["unit"], rec["event"]
            if event == "finished":
                s.pending.pop(unit, None)
                s.doubtful.pop(unit, None)
                s.tracked.discard(unit)
                s.accepted.discard(unit)
                s.held.pop(unit, None)
                if s.units[unit].direct is not None:  # no supervisor or `post` of its own removes it
                    remove_unit_dir(os.path.join(s.units_dir, unit))
                if unit in s.watched:
                    s.watched.discard(unit)
                    result = s.units[unit].result
                    assert result is not None  # this `finished` record set it (fold)
                    self.emit_finished(unit, result)
            elif event == "started":
                for signum in s.pending.pop(unit, ()):
                    self.kill(rec["pid"], signum)
            else:
                s.out.append(dumps({k: rec.get(k) for k in ("event", "unit", "launch_id", "index", "exit_code",
                                                           "signal", "error")}))
        news.clear()

    def maybe_compact(self) -> None:
        """Rewrite the journal as the live units' records once it has grown past the limit."""
        s = self.state
        if s.offset < s.journal_limit:
            return
        old = s.jfd
        try:
            fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            s.compact_soon = True  # a supervisor or ExecStopPost is appending: try again shortly
            return
        s.compact_soon = False
        tmp, fd = s.journal_path + ".new", -1
        try:
            self.catch_up()
            data = self.live_records()
            fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            write_all(fd, data, tmp)
            os.fsync(fd)
            os.rename(tmp, s.journal_path)  # from here on, fd is the journal
            s.jfd, fd = fd, -1
            s.offset, s.synced = len(data), 0  # offsets now are the new file's
            s.journal_limit = max(s.base_limit, 2 * len(data))
            fsync_dir(s.spool)
            s.synced = len(data)
            for u in s.units.values():
                u.durable = True  # its result, if it has one, is in the fsynced file
        except OSError as exc:
            s.journal_limit = 2 * s.offset  # not at every turn: the spool may be full
            print(f"agent: cannot compact {s.journal_path}: {exc}; it grows meanwhile", file=sys.stderr)
            if fd >= 0:
                os.close(fd)
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        finally:
            fcntl.flock(old, fcntl.LOCK_UN)
            if old != s.jfd:
                os.close(old)

    def live_records(self) -> bytes:
        parts = [record("journal", version=JOURNAL_VERSION)]
        for name, u in self.state.units.items():
            mode: dict[str, Any] = {} if u.mode == "plain" else {"mode": u.mode}
            if u.direct is not None:
                mode["direct"] = u.direct
            if u.uid is not None:
                mode["uid"] = u.uid
            if u.reread is not None:
                mode["reread"] = u.reread
            parts.append(record("launched", unit=name, start_time=u.start_time, **mode))
            if u.pid is not None:
                parts.append(
                    record("started", unit=name, pid=u.pid, starttime=u.starttime, boot=u.boot, job=u.job)
                )
            if u.kill is not None:
                parts.append(record("kill_requested", unit=name, reason=u.kill))
            if u.result is not None:
                parts.append(record("finished", unit=name, result=u.result))
        for name, after in self.state.left.items():  # successors.py: a leaver its followers look through
            parts.append(record("queued", unit=name, spec={"unit": name, "after": after})
                         + record("dequeued", unit=name, reason="left"))
        for name, spec in self.state.queued.items():  # successors.py: a queued unit is no unit yet
            parts.append(record("queued", unit=name, spec=spec))
        return b"".join(parts)

    # -- unit state

    def unit_status(self, unit: str, known: dict | None = None) -> Status | None:
        """(status, start_time, result, supervisor pid or None) of a unit, or None if it is not known.

        The caller has caught up with the journal. A unit with no result runs while its supervisor
        does (forked here, or recorded in `started` and alive in this boot) and, for a systemd unit,
        while its start is not answered yet, or systemd knows it (`tracked`: it said so on the live
        connection, which will bring its UnitRemoved; else `known`: unit -> bool, from
        link.systemd_known, asked here if the unit is not in it), or it was launched less than
        START_GRACE ago by another agent (whose call systemd may not have read yet). One with no
        result that does not run has lost its supervisor (or its ExecStopPost recorded nothing):
        this records the result that says so.
        """
        s = self.state
        u = s.units.get(unit)
        if u is None:
            return None
        if u.result is None and unit in s.child_units:
            pid, start_time = s.child_units[unit]
            return "running", start_time, None, pid
        if u.result is None and u.pid and u.boot == s.boot and is_alive(u.pid, u.starttime):
            return "running", u.start_time, None, u.pid
        if u.result is None and u.pid is None and s.doubtful.get(unit, 0.0) > time.monotonic():
            return "running", u.start_time, None, None  # forked by a zygote that died: zygote.py
        if u.result is None and (unit in s.starting or unit in s.tracked):
            return "running", u.start_time, None, None
        if u.result is None and u.direct is not None:  # its stop script may have left its record
            self.take_records([unit])
        if u.result is None and u.mode != "plain":  # the rare path: `post` runs, or it never started
            if known is None or unit not in known:
                known = self.link.systemd_known([unit])
            if known.get(unit, True):  # True: systemd did not answer, so nothing is known lost
                return "running", u.start_time, None, None
            if (u.pid is None and unit not in s.accepted and unit not in s.ended
                    and time.time() - (u.start_time or 0) < START_GRACE):
                return "running", u.start_time, None, None
        if u.result is None:
            self.catch_up()  # it may have ended since we looked
        if u.result is None:
            self.record_lost(unit, u)
        assert u.result is not None  # record_lost's `finished` record, folded by append
        return "finished", u.result.get("start_time"), u.result, None

    def take_records(self, units: list[str]) -> None:
        """Append, in one write with one fdatasync, the finished records that the stop scripts of
        these direct units left (systemd.stop_records): durable before anything reports them, and
        before their host directories go (catch_up folds them)."""
        from .systemd import stop_records

        found = stop_records(self.state.units_dir, self.state.units, units)
        if found:
            self.append(found, sync=True)

    def record_lost(self, unit: str, u: Unit) -> None:
        """Record (durably) the result of a unit whose supervisor died, or whose host restarted.

        In plain mode the job's remaining processes are killed, so that nothing runs unsupervised
        (under systemd, the unit's end took them): every process of the dead supervisor's session
        (tree.kill_lost_session), and the job's process group, recognised by that session: the
        kernel does not reuse a pid while a session or group of that number exists.
        """
        self.link.forget_end(unit)  # a watched unit's PropertiesChanged are of no use now
        ended = self.state.ended.pop(unit, None)
        if ended is not None:  # over, and kept loaded for its result by systemd (link.systemd_known)
            self.record_ended(unit, u, ended[1])
            self.link.release(unit, ended[0])
            return
        if u.pid and u.boot != self.state.boot:
            reason = "supervisor lost: the host restarted while the job ran, so its exit status is unknown"
        elif u.mode != "plain":
            reason = (
                f"supervisor lost: systemd does not know unit {unit} (it never started, or ended without a "
                f"result), so the job's exit status is unknown; see journalctl {'--user ' if u.mode == 'user' else ''}"
                f"-u {unit}"
            )
            if u.direct is not None and u.direct.get("record") == "agent":  # kept loaded until recorded: gone
                reason = (
                    f"lost: systemd does not know unit {unit}, which the agent had not recorded (the host "
                    f"restarted, or it never started), so the job's exit status is unknown; see journalctl "
                    f"{'--user ' if u.mode == 'user' else ''}-u {unit}"
                )
            elif u.direct is not None:
                reason = (
                    f"lost: systemd does not know unit {unit} and its ExecStopPost recorded no result (it never "
                    f"started, or ended unrecorded), so the job's exit status is unknown; see journalctl "
                    f"{'--user ' if u.mode == 'user' else ''}-u {unit}"
                )
            if u.kill:  # a kill asked for before systemd started it cancels its start: nothing ran
                reason = u.kill
        elif u.pid is None:  # its fork was never answered (zygote.py), or it died before its first record
            reason = "supervisor lost: it never recorded its start, so whether the job ran is unknown"
        else:
            reason = "supervisor lost: it was killed or crashed, so the job's exit status is unknown"
            fields = proc_stat(u.job) if u.job else None
            killed = kill_lost_session(u.pid, u.starttime) if u.pid else 0
            if (u.job is not None and fields is not None and fields[2] == str(u.job).encode()
                    and fields[3] == str(u.pid).encode()):
                try:
                    os.killpg(u.job, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            if killed:
                reason += "; its remaining processes were killed"
        result = make_result(u.start_time or time.time(), reason, mode=u.mode)
        self.append(record("finished", unit=unit, result=result), sync=True)

    def record_ended(self, unit: str, u: Unit, props: dict) -> None:
        """Record the result of a direct unit that records none of its own, from what systemd says of
        it (`props`: systemd.END_PROPERTIES). Not fdatasync'ed here: reported() has it synced before
        the line that carries it goes out, one sync for all the results of a loop turn."""
        from .systemd import unit_result

        limits = (u.direct or {}).get("limits") or (None, None)
        host_dir = os.path.join(self.state.units_dir, unit)
        result = unit_result(unit, props, u.start_time or time.time(), u.mode, host_dir, tuple(limits))
        self.append(record("finished", unit=unit, result=result))

    def reported(self, unit: str, result: dict) -> dict:
        """`result` of `unit`, about to go out: make sure it is on disk before the line is written."""
        s = self.state
        u = s.units.get(unit)
        if u is not None and not u.durable and u.result_end > s.synced:
            s.need_sync = True
        return result

    def emit_finished(self, unit: str, result: dict) -> None:
        self.state.out.append(dumps({"event": "finished", "unit": unit, "result": self.reported(unit, result)}))

    def report_if_finished(self, unit: str, known: dict | None = None) -> bool:
        """Emit `finished` for the unit if it has ended; True if it is no longer running."""
        status = self.unit_status(unit, known)
        if status is not None and status[0] == "finished" and status[2] is not None:
            self.emit_finished(unit, status[2])
        return status is None or status[0] == "finished"

    def reap(self) -> None:
        """Collect every exited child: supervisors forked here (their unit is reported; gone if
        forgotten), the tasks' supervisors of direct units, and the zygote."""
        ended = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if self.state.task_children.pop(pid, None) is not None:
                continue  # its tasks' ends are in the journal
            ended.append((pid, status))
        self.reaped_children(ended)

    def reaped_children(self, ended: Sequence[tuple[int, int | None]]) -> None:
        """Supervisors that ended, (pid, wait status): reaped here, or by the zygote (zygote.py); a
        status None is a reused supervisor's "d" (its result is not known durable: pool.py)."""
        s = self.state
        reaped = []
        for pid, status in ended:
            unit = s.children.pop(pid, None)
            if unit is not None and s.child_units[unit][0] == pid:  # not a forgotten launch's
                del s.child_units[unit]
                reaped.append((unit, status))
        if not reaped:
            return
        self.catch_up()
        for unit, status in reaped:
            u = s.units.get(unit)
            if status == 0 and u is not None and u.result is not None:
                u.durable = True  # a supervisor exits 0 only once its result is fdatasync'ed
            self.report_if_finished(unit)

    def poll_watched(self) -> None:
        """Report the watched units that ended; ask systemd, in one go, about those whose supervisor
        is gone (or not yet started)."""
        s = self.state
        self.catch_up()
        units = sorted(s.watched)
        known = self.ask_systemd(units)
        for unit in units:
            if self.report_if_finished(unit, known):
                s.watched.discard(unit)
        self.link.retry_releases()

    def ask_systemd(self, units: list[str]) -> dict[str, bool]:
        """link.systemd_known() for those of `units` that only systemd can judge now: systemd units with
        no result, not being started here nor tracked, whose supervisor is gone or not yet started."""
        s = self.state
        doubtful = [
            unit for unit in units
            if (u := s.units.get(unit)) is not None and u.result is None and u.mode != "plain"
            and unit not in s.starting and unit not in s.tracked
            and not (u.pid and u.boot == s.boot and is_alive(u.pid, u.starttime))
        ]
        return self.link.systemd_known(doubtful) if doubtful else {}

    def kill(self, pid: int, signum: int) -> bool:
        try:
            os.kill(pid, signum)
            return True
        except ProcessLookupError:
            return False

    def deliver(self, unit: str, pid: int | None, signum: int) -> bool:
        """Send `signum` to the unit's supervisor, or hold it until the supervisor has started
        (a systemd unit between systemd-run and its supervisor's `started`)."""
        if pid is None or not self.settle(pid):  # a worker handed its job before its "i": that first (pool.py);
            self.state.pending.setdefault(unit, []).append(signum)  # one that gave none: held until `started`
            return True
        return self.kill(pid, signum)
