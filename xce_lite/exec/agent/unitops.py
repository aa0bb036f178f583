"""The requests that start, signal and forget units (a part of the Agent, server.py): launch,
signal, forget.

Invariant: a unit runs at most once. Its `launched` record is appended before the fork or the call
to systemd, and a launch of a unit the journal knows is adopted (reported running or finished).
"""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from typing import Any

    from .lease import HostLease
    from .manager import Manager
    from .shared import AgentState
    from .state import Status, UnitState
    from .zygote import ZygoteOps

import os
import time

from .journal import record
from .jsonl import dumps
from .lease import LEASE_REREAD
from .recorders import JournalRecorder
from .runas import JOB_DIR, chown_to, remove_unit_dir, resolve_user, share_spool, user_env
from .signals import REQUEST_NAMES, signal
from .spawn import direct_start_problem
from .supervisor import fork_supervisor, make_host_dir
from .systemd import ENV_FILE, env_file_text
from .util import format_limit, format_size, job_umask, make_result, write_file
from .validate import Refused, valid_unit_name, validate
from .zygote import START_GRACE_PLAIN


class UnitOps:
    """The launch, signal and forget requests: units are recorded and judged by `unit_state`,
    started by `manager` (systemd modes) or `zygotes` (plain mode), and only under `host_lease`."""

    def __init__(self, state: AgentState, unit_state: UnitState, manager: Manager, zygotes: ZygoteOps,
                 host_lease: HostLease):
        self.state, self.unit_state, self.manager = state, unit_state, manager
        self.zygotes, self.host_lease = zygotes, host_lease

    def job_env(self, env: dict, unit: str, host_dir: str, hostfile: bool) -> dict:
        """The job's (or task's) environment: what the controller gave, with the unit's host
        directory, the way to `xce launch`, SPOOL/bin (the `xce` shim) at the end of PATH and,
        with a hostfile, its path."""
        s = self.state
        env = dict(env)
        env.update(XCE_UNIT=unit, XCE_JOB_HOST_DIR=host_dir, XCE_LAUNCH_SOCKET=s.sock_path)
        path = env.get("PATH") or os.defpath.lstrip(":")
        if s.bin_dir not in path.split(":"):  # a task's env may come from its job's
            env["PATH"] = f"{path}:{s.bin_dir}"
        if hostfile:
            env["XCE_HOSTFILE"] = os.path.join(host_dir, "hostfile")
        return env

    def op_launch(self, req: dict) -> dict:
        """Start or adopt each unit. In plain mode the supervisors are forked after the loop, all in
        one round trip to the zygote (zygote.py); until then a unit counts as starting (`doubtful`),
        so that a unit named twice in one request is adopted, not judged lost."""
        self.unit_state.catch_up()
        forks: list[tuple[str, dict, float, dict]] = []
        replies = [self.launch_one(u, forks) for u in req.get("units", [])]
        if forks:
            self.fork_supervisors(forks)
        return {"replies": replies}

    def fork_supervisors(self, forks: list[tuple[str, dict, float, dict]]) -> None:
        """Fork the supervisors of (unit, spec, start_time, reply): by the zygote, or here where
        there is none; each reply says "started", or why not."""
        s = self.state
        answers = self.zygotes.spawn_supervisors([(unit, spec, start) for unit, spec, start, _reply in forks])
        for (unit, spec, start_time, reply), (pid, why) in zip(forks, answers):
            if pid is None and why is None:  # no zygote: fork it here, as before there was one
                old = os.umask(job_umask(spec))  # the supervisor's own files have explicit modes (0600, 0700)
                try:
                    pid = fork_supervisor(JournalRecorder(s.spool, unit, s.boot), spec, start_time)
                except OSError as exc:
                    why = str(exc)
                finally:
                    os.umask(old)
            if pid is not None:
                s.children[pid] = unit
                s.child_units[unit] = (pid, start_time)
            elif why != "unknown":  # nothing started: it may be launched again
                s.doubtful.pop(unit, None)
                self.unit_state.append(record("forgotten", units=[unit]))
                reply.update(status="refused", error=f"cannot start the supervisor: {why}; the host may be out of "
                                                     "resources")
                continue
            # "unknown": the zygote died before it answered; the unit counts as starting (zygote.py)
            reply.update(status="started", start_time=start_time)
        self.zygotes.take_exits()  # supervisors that ended before their fork's answer was read

    def launch_one(self, u: dict, forks: list | None = None) -> dict:
        """Start one unit, or adopt it if the journal knows it (a unit never runs twice). In plain
        mode with `forks`, the supervisor's fork is left there for fork_supervisors."""
        s = self.state
        reply = {"unit": u.get("unit") if isinstance(u, dict) else None, "status": "refused", "start_time": None,
                 "error": None}
        try:
            validate(u, s.mode)
        except Refused as exc:
            reply["error"] = str(exc)
            return reply
        unit: str = u["unit"]  # validate() checked it
        if unit in s.units:
            status = self.unit_state.unit_status(unit)
            assert status is not None  # the journal knows it
            return self.adopt(unit, reply, status)
        lapsed = self.host_lease.lease_lapsed()
        if lapsed is not None:  # a launch that waited in a frozen channel: its job may run elsewhere now
            reply["error"] = lapsed
            return reply
        try:
            user = None if u.get("user") is None else resolve_user(u["user"], s.host_name)
        except Refused as exc:
            reply["error"] = str(exc)
            return reply
        start_time = time.time()
        keys = ("unit", "argv", "env", "cwd", "stdout", "stderr", "run_limit", "mem_limit", "grace", "hostfile",
                "hooks", "profile_env", "post_failure", "starter", "umask")
        spec: dict[str, Any] = {k: u.get(k) for k in keys}
        host_dir = os.path.join(s.units_dir, unit)
        spec.update(role=u.get("role", "job"), start_time=start_time, spool=s.spool, mode=s.mode)
        spec["host_dir"] = host_dir
        if user is not None:  # its own directory, in ours: see supervisor.make_host_dir
            spec.update(user=user, job_dir=os.path.join(host_dir, JOB_DIR))
            if not s.spool_shared:
                try:
                    self.share()
                except OSError as exc:
                    reply["error"] = f"cannot open spool {s.spool} to its jobs' users: {exc.strerror}"
                    return reply
        if spec["grace"] is None:
            spec["grace"] = 10.0
        spec["env"] = self.job_env(spec["env"], unit, spec.get("job_dir", host_dir), spec["hostfile"] is not None)
        direct = None
        if s.mode != "plain":
            spec["watch_run_limit"] = False  # RuntimeMaxSec enforces it: one reason, not two racing
            spec["watch_mem_limit"] = s.host["modes"][s.mode]["memory"] != "systemd"
            if self.manager.direct_unfit(spec) is None:
                direct = {"stdout": spec["stdout"], "stderr": spec["stderr"], "grace": spec["grace"]}
                if spec.get("starter"):
                    direct["starter"] = spec["starter"]
                if spec.get("umask") is not None:  # for its tasks' supervisor (fork_tasks)
                    direct["umask"] = spec["umask"]
                if user is not None:  # its tasks run as the job's user too
                    direct["user"] = user
                if self.manager.agent_records(spec):  # no ExecStopPost: manager.py
                    direct["record"] = "agent"
                    direct["limits"] = [format_limit(spec["run_limit"]) if spec.get("run_limit") else None,
                                        format_size(int(spec["mem_limit"])) if spec.get("mem_limit") else None]
        try:
            mode: dict[str, Any] = {} if s.mode == "plain" else {"mode": s.mode}
            if direct is not None:
                mode["direct"] = direct
            if user is not None:  # whose `xce launch` may ask for tasks of it (tasks.py)
                mode["uid"] = user["uid"]
            if direct is None:  # its supervisor (watch.py) obeys a shortened lease within this
                mode["reread"] = LEASE_REREAD
            self.unit_state.append(record("launched", unit=unit, start_time=start_time, **mode))
        except OSError as exc:
            reply["error"] = f"cannot write {s.journal_path}: {exc.strerror}; check the spool's file system"
            return reply
        if s.mode != "plain":
            return self.launch_unit(spec, reply, direct is not None)
        spec["host_dir_by"] = spec["hooks_by"] = "supervisor"
        if forks is not None:
            s.doubtful[unit] = time.monotonic() + START_GRACE_PLAIN  # adopted if named again meanwhile
            forks.append((unit, spec, start_time, reply))
            return reply
        old = os.umask(job_umask(spec))  # the supervisor's own files have explicit modes (0600, 0700)
        try:
            pid = fork_supervisor(JournalRecorder(s.spool, unit, s.boot), spec, start_time)
        except OSError as exc:
            self.unit_state.append(record("forgotten", units=[unit]))  # nothing started: it may be launched again
            reply["error"] = f"cannot start the supervisor: {exc}; the host may be out of resources"
            return reply
        finally:
            os.umask(old)
        s.children[pid] = unit
        s.child_units[unit] = (pid, start_time)
        reply.update(status="started", start_time=start_time)
        return reply

    def launch_unit(self, spec: dict, reply: dict, direct: bool) -> dict:
        """Ask systemd for the unit (its `launched` is in the journal): the reply says "started" at
        once; a refusal becomes the unit's finished result, and so does a direct job that could
        not start (worded as the supervisor would: exec failed, output files)."""
        s = self.state
        unit, host_dir = spec["unit"], spec["host_dir"]
        try:
            remove_unit_dir(host_dir)  # a lost launch's leftovers: its result.json is not this one's
            make_host_dir(spec)
            if direct:
                result = direct_start_problem(spec)
                if result is None:  # the job's bytes, for EXEC_SCRIPT: never on the unit (see systemd.py)
                    env_file = os.path.join(host_dir, ENV_FILE)
                    user = spec.get("user")  # HOME, USER, LOGNAME: the passwd entry's, not the submitted env's
                    write_file(env_file, env_file_text(spec["argv"], user_env(spec["env"], user)))
                    chown_to(env_file, user)  # theirs to read (their own env), in our 0711 directory
            else:
                result = None
                write_file(os.path.join(host_dir, "spec.json"), dumps(spec))
        except OSError as exc:
            reason = f"cannot make the job's host directory {host_dir}: {exc.strerror}"
            result = make_result(spec["start_time"], reason)
        if result is not None:
            result["mode"] = s.mode
            self.unit_state.append(record("finished", unit=unit, result=result), sync=True)
            self.unit_state.emit_finished(unit, result)
            remove_unit_dir(host_dir)
            result = self.unit_state.reported(unit, result)
            reply.update(status="finished", start_time=spec["start_time"], result=result)
            return reply
        self.manager.start_unit(spec, direct)
        s.watched.add(unit)
        reply.update(status="started", start_time=spec["start_time"])
        return reply

    def adopt(self, unit: str, reply: dict, status: Status) -> dict:
        s = self.state
        state, start_time, result, _pid = status
        reply.update(status=state, start_time=start_time)
        if state == "finished":
            assert result is not None  # a finished unit has its result (unit_status)
            reply["result"] = self.unit_state.reported(unit, result)
            self.unit_state.emit_finished(unit, result)
        elif unit not in s.child_units:
            s.watched.add(unit)
        return reply

    def op_signal(self, req: dict) -> dict:
        unit, name = req.get("unit"), req.get("signal")
        if name not in REQUEST_NAMES:
            raise Refused(f"unknown signal {name!r}: use one of {', '.join(REQUEST_NAMES)}")
        if not valid_unit_name(unit):
            raise Refused(f"bad unit name {unit!r}")
        self.unit_state.catch_up()
        status = self.unit_state.unit_status(unit)
        if status is None or status[0] != "running":
            return {"found": False}
        reason = str(req.get("reason") or "")
        self.unit_state.append(record("kill_requested", unit=unit, reason=reason))
        u = self.state.units[unit]
        if u.direct is not None or (u.mode != "plain" and status[3] is None and name in ("TERM", "INT", "HUP", "KILL")):
            # a direct unit; or a supervisor not started yet (its pre hooks may run): systemd stops the unit
            return {"found": self.manager.signal_direct(unit, name, reason)}
        signum = signal.SIGTERM if name == "TERM" else signal.SIGRTMIN + REQUEST_NAMES.index(name)
        return {"found": self.unit_state.deliver(unit, status[3], signum)}

    def share(self) -> None:
        """Open the spool to the users jobs run as (runas.share_spool), once."""
        share_spool(self.state.spool)
        self.state.spool_shared = True

    def op_forget(self, req: dict) -> dict:
        s = self.state
        self.unit_state.catch_up()
        replies, gone = [], []
        for unit in req.get("units", []):
            reply = {"unit": unit, "ok": True, "error": None}
            if not valid_unit_name(unit):
                reply.update(ok=False, error=f"bad unit name {unit!r}")
            elif (self.unit_state.unit_status(unit) or ("gone",))[0] == "running":
                reply.update(
                    ok=False,
                    error=f"unit {unit} is still running: signal it and forget it after its finished event",
                )
            else:
                if unit in s.units and unit not in gone:
                    gone.append(unit)
                s.watched.discard(unit)
                s.doubtful.pop(unit, None)
            replies.append(reply)
        if gone:
            self.unit_state.append(record("forgotten", units=gone))
            for unit in gone:  # a lost unit's host directory: nobody else removes it
                if os.path.lexists(os.path.join(s.units_dir, unit)):
                    remove_unit_dir(os.path.join(s.units_dir, unit))
        return {"units": replies}
