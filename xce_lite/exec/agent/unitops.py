"""The requests that start, signal and forget units (part of the Agent, server.py): launch, signal,
forget.

Invariant: a unit runs at most once. Its `launched` record is appended before the fork or the call
to systemd, and a launch of a unit the journal knows is adopted (reported running or finished).
"""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from typing import Any

    from .state import Status

import os
import sys
import time

from .base import AgentBase
from .dbus import manager_socket
from .journal import record
from .jsonl import dumps
from .recorders import JournalRecorder
from .runas import JOB_DIR, chown_to, remove_unit_dir, resolve_user, user_env
from .signals import REQUEST_NAMES, signal
from .spawn import direct_start_problem
from .supervisor import fork_supervisor, make_host_dir
from .systemd import ENV_FILE, env_file_text
from .util import job_umask, make_result, write_file
from .validate import Refused, valid_unit_name, validate
from .zygote import START_GRACE_PLAIN


class UnitOps(AgentBase):
    """The Agent's launch, signal and forget requests (the attributes are the Agent's)."""

    def job_env(self, env: dict, unit: str, host_dir: str, hostfile: bool) -> dict:
        """The job's (or task's) environment: what the controller gave, with the unit's host
        directory, the way to `xce launch`, SPOOL/bin (the `xce` shim) at the end of PATH and,
        with a hostfile, its path."""
        env = dict(env)
        env.update(XCE_UNIT=unit, XCE_JOB_HOST_DIR=host_dir, XCE_LAUNCH_SOCKET=self.sock_path)
        path = env.get("PATH") or os.defpath.lstrip(":")
        if self.bin_dir not in path.split(":"):  # a task's env may come from its job's
            env["PATH"] = f"{path}:{self.bin_dir}"
        if hostfile:
            env["XCE_HOSTFILE"] = os.path.join(host_dir, "hostfile")
        return env

    def op_launch(self, req: dict) -> dict:
        """Start or adopt each unit. In plain mode the supervisors are forked after the loop, all in
        one round trip to the zygote (zygote.py); until then a unit counts as starting (`doubtful`),
        so that a unit named twice in one request is adopted, not judged lost."""
        self.catch_up()
        forks: list[tuple[str, dict, float, dict]] = []
        replies = [self.launch_one(u, forks) for u in req.get("units", [])]
        if forks:
            self.fork_supervisors(forks)
        return {"replies": replies}

    def fork_supervisors(self, forks: list[tuple[str, dict, float, dict]]) -> None:
        """Fork the supervisors of (unit, spec, start_time, reply): by the zygote, or here where
        there is none; each reply says "started", or why not."""
        answers = self.spawn_supervisors([(unit, spec, start) for unit, spec, start, _reply in forks])
        for (unit, spec, start_time, reply), (pid, why) in zip(forks, answers):
            if pid is None and why is None:  # no zygote: fork it here, as before there was one
                old = os.umask(job_umask(spec))  # the supervisor's own files have explicit modes (0600, 0700)
                try:
                    pid = fork_supervisor(JournalRecorder(self.spool, unit, self.boot), spec, start_time)
                except OSError as exc:
                    why = str(exc)
                finally:
                    os.umask(old)
            if pid is not None:
                self.children[pid] = unit
                self.child_units[unit] = (pid, start_time)
            elif why != "unknown":  # nothing started: it may be launched again
                self.doubtful.pop(unit, None)
                self.append(record("forgotten", units=[unit]))
                reply.update(status="refused", error=f"cannot start the supervisor: {why}; the host may be out of "
                                                     "resources")
                continue
            # "unknown": the zygote died before it answered; the unit counts as starting (zygote.py)
            reply.update(status="started", start_time=start_time)
        self.take_exits()  # supervisors that ended before their fork's answer was read

    def launch_one(self, u: dict, forks: list | None = None) -> dict:
        """Start one unit, or adopt it if the journal knows it (a unit never runs twice). In plain
        mode with `forks`, the supervisor's fork is left there for fork_supervisors."""
        reply = {"unit": u.get("unit") if isinstance(u, dict) else None, "status": "refused", "start_time": None,
                 "error": None}
        try:
            validate(u, self.mode)
        except Refused as exc:
            reply["error"] = str(exc)
            return reply
        unit: str = u["unit"]  # validate() checked it
        if unit in self.units:
            status = self.unit_status(unit)
            assert status is not None  # the journal knows it
            return self.adopt(unit, reply, status)
        lapsed = self.lease_lapsed()
        if lapsed is not None:  # a launch that waited in a frozen channel: its job may run elsewhere now
            reply["error"] = lapsed
            return reply
        try:
            user = None if u.get("user") is None else resolve_user(u["user"], self.host_name)
        except Refused as exc:
            reply["error"] = str(exc)
            return reply
        start_time = time.time()
        keys = ("unit", "argv", "env", "cwd", "stdout", "stderr", "run_limit", "mem_limit", "grace", "hostfile",
                "hooks", "profile_env", "post_failure", "starter", "umask")
        spec: dict[str, Any] = {k: u.get(k) for k in keys}
        host_dir = os.path.join(self.units_dir, unit)
        spec.update(role=u.get("role", "job"), start_time=start_time, spool=self.spool, mode=self.mode)
        spec["host_dir"] = host_dir
        if user is not None:  # its own directory, in ours: see supervisor.make_host_dir
            spec.update(user=user, job_dir=os.path.join(host_dir, JOB_DIR))
            if not self.spool_shared:
                try:
                    self.share()
                except OSError as exc:
                    reply["error"] = f"cannot open spool {self.spool} to its jobs' users: {exc.strerror}"
                    return reply
        if spec["grace"] is None:
            spec["grace"] = 10.0
        spec["env"] = self.job_env(spec["env"], unit, spec.get("job_dir", host_dir), spec["hostfile"] is not None)
        direct = None
        if self.mode != "plain":
            spec["watch_run_limit"] = False  # RuntimeMaxSec enforces it: one reason, not two racing
            spec["watch_mem_limit"] = self.host["modes"][self.mode]["memory"] != "systemd"
            if self.direct_unfit(spec) is None:
                direct = {"stdout": spec["stdout"], "stderr": spec["stderr"], "grace": spec["grace"]}
                if spec.get("starter"):
                    direct["starter"] = spec["starter"]
                if spec.get("umask") is not None:  # for its tasks' supervisor (fork_tasks)
                    direct["umask"] = spec["umask"]
                if user is not None:  # its tasks run as the job's user too
                    direct["user"] = user
        try:
            mode: dict[str, Any] = {} if self.mode == "plain" else {"mode": self.mode}
            if direct is not None:
                mode["direct"] = direct
            if user is not None:  # whose `xce launch` may ask for tasks of it (tasks.py)
                mode["uid"] = user["uid"]
            self.append(record("launched", unit=unit, start_time=start_time, **mode))
        except OSError as exc:
            reply["error"] = f"cannot write {self.journal_path}: {exc.strerror}; check the spool's file system"
            return reply
        if self.mode != "plain":
            return self.launch_unit(spec, reply, direct is not None)
        spec["host_dir_by"] = spec["hooks_by"] = "supervisor"
        if forks is not None:
            self.doubtful[unit] = time.monotonic() + START_GRACE_PLAIN  # adopted if named again meanwhile
            forks.append((unit, spec, start_time, reply))
            return reply
        old = os.umask(job_umask(spec))  # the supervisor's own files have explicit modes (0600, 0700)
        try:
            pid = fork_supervisor(JournalRecorder(self.spool, unit, self.boot), spec, start_time)
        except OSError as exc:
            self.append(record("forgotten", units=[unit]))  # nothing started: it may be launched again
            reply["error"] = f"cannot start the supervisor: {exc}; the host may be out of resources"
            return reply
        finally:
            os.umask(old)
        self.children[pid] = unit
        self.child_units[unit] = (pid, start_time)
        reply.update(status="started", start_time=start_time)
        return reply

    def launch_unit(self, spec: dict, reply: dict, direct: bool) -> dict:
        """Ask systemd for the unit (its `launched` is in the journal): the reply says "started" at
        once; a refusal becomes the unit's finished result, and so does a direct job that could
        not start (worded as the supervisor would: exec failed, output files)."""
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
            result["mode"] = self.mode
            self.append(record("finished", unit=unit, result=result), sync=True)
            self.emit_finished(unit, result)
            remove_unit_dir(host_dir)
            reply.update(status="finished", start_time=spec["start_time"], result=self.reported(unit, result))
            return reply
        self.start_unit(spec, direct)
        self.watched.add(unit)
        reply.update(status="started", start_time=spec["start_time"])
        return reply

    def adopt(self, unit: str, reply: dict, status: Status) -> dict:
        state, start_time, result, _pid = status
        reply.update(status=state, start_time=start_time)
        if state == "finished":
            assert result is not None  # a finished unit has its result (unit_status)
            reply["result"] = self.reported(unit, result)
            self.emit_finished(unit, result)
        elif unit not in self.child_units:
            self.watched.add(unit)
        return reply

    def op_signal(self, req: dict) -> dict:
        unit, name = req.get("unit"), req.get("signal")
        if name not in REQUEST_NAMES:
            raise Refused(f"unknown signal {name!r}: use one of {', '.join(REQUEST_NAMES)}")
        if not valid_unit_name(unit):
            raise Refused(f"bad unit name {unit!r}")
        self.catch_up()
        status = self.unit_status(unit)
        if status is None or status[0] != "running":
            return {"found": False}
        reason = str(req.get("reason") or "")
        self.append(record("kill_requested", unit=unit, reason=reason))
        u = self.units[unit]
        if u.direct is not None or (u.mode != "plain" and status[3] is None and name in ("TERM", "INT", "HUP", "KILL")):
            # a direct unit; or a supervisor not started yet (its pre hooks may run): systemd stops the unit
            return {"found": self.signal_direct(unit, name, reason)}
        signum = signal.SIGTERM if name == "TERM" else signal.SIGRTMIN + REQUEST_NAMES.index(name)
        return {"found": self.deliver(unit, status[3], signum)}

    def signal_direct(self, unit: str, name: str, reason: str) -> bool:
        """A signal request for a direct unit, through systemd: TERM, INT and HUP stop the unit
        (TERM to all its processes, KILL after TimeoutStopSec), KILL kills them all and stops it
        (a stop cancels a start job still waiting: nothing runs), the others go to all its
        processes (KillUnit), once its start job is over (held until then: they would be lost).
        The reason for STOP_SCRIPT is left in the host directory first."""
        if unit in self.held and name not in ("TERM", "INT", "HUP", "KILL"):
            self.held[unit].append(name)
            return True
        host_dir = os.path.join(self.units_dir, unit)
        try:
            if name in ("TERM", "INT", "HUP", "KILL"):
                write_file(os.path.join(host_dir, "kill_reason"), dumps(reason[:1000] or "killed"))
            elif name in ("USR1", "USR2"):
                write_file(os.path.join(host_dir, "signalled"), f"{name} ".encode() + dumps(reason[:1000] or None))
        except OSError as exc:
            print(f"agent: cannot note the reason for {unit} in {host_dir}: {exc}", file=sys.stderr)
        bus = self.connect_bus(now=True)
        if bus is None:
            raise Refused(f"systemd does not answer at {manager_socket(self.mode, self.host.get('env', {}))}; "
                          "try again")
        service = f"{unit}.service"
        if name not in ("TERM", "INT", "HUP"):
            signum = getattr(signal, f"SIG{name}")
            self.calls[bus.send("KillUnit", "ssi", (service, "all", signum))] = ("kill", unit)
        if name in ("TERM", "INT", "HUP", "KILL"):
            self.calls[bus.send("StopUnit", "ss", (service, "replace"))] = ("stop", unit)
        return True

    def op_forget(self, req: dict) -> dict:
        self.catch_up()
        replies, gone = [], []
        for unit in req.get("units", []):
            reply = {"unit": unit, "ok": True, "error": None}
            if not valid_unit_name(unit):
                reply.update(ok=False, error=f"bad unit name {unit!r}")
            elif (self.unit_status(unit) or ("gone",))[0] == "running":
                reply.update(
                    ok=False,
                    error=f"unit {unit} is still running: signal it and forget it after its finished event",
                )
            else:
                if unit in self.units and unit not in gone:
                    gone.append(unit)
                self.watched.discard(unit)
                self.doubtful.pop(unit, None)
            replies.append(reply)
        if gone:
            self.append(record("forgotten", units=gone))
            for unit in gone:  # a lost unit's host directory: nobody else removes it
                if os.path.lexists(os.path.join(self.units_dir, unit)):
                    remove_unit_dir(os.path.join(self.units_dir, unit))
        return {"units": replies}
