"""The agent's side of systemd (a part of the Agent, server.py): the calls on the manager's private
socket (start, stop, kill, attach; the connection is link.py's) and what comes back, read on the
serve loop's poll(); and what each unit is made of (its transient service's properties).

A direct unit whose end the agent records itself (agent_records: no ExecStopPost, whose fork by
systemd was a unit's largest extra cost) stays loaded once over (RemainAfterExit=yes, and
CollectMode=inactive keeps a failed one) until its result is in the journal: read here from its
PropertiesChanged, or by link.systemd_known when the agent was away; then it is let go.

Invariant: the agent never waits for the manager, but for its answers to the starts it asked for
before exiting (finish_starting); a call systemd refuses is the unit's result.
"""

from __future__ import annotations

import os
import sys
import time

from .dbus import DBUS_ERROR, DBUS_SIGNAL, DBUS_TIMEOUT, DBusMessage, manager_socket
from .hooks import hooks_budget
from .journal import Unit, record
from .jsonl import dumps
from .link import answer_tasks
from .recorders import JournalRecorder
from .supervisor import fork_task_supervisor
from .systemd import END_PROPERTIES, ENV_FILE, STOP_MARGIN, unit_over
from .runas import remove_unit_dir
from .signals import signal
from .util import format_limit, format_size, job_umask, make_result, write_file
from .validate import ENV_NAME_CHARS, Refused, dbus_text_ok, normal_path

TYPE_CHECKING = False  # true for mypy only: see shared.py
if TYPE_CHECKING:
    from .link import ManagerLink
    from .shared import AgentState
    from .state import UnitState


class Manager:
    """The calls on systemd and their answers, over `link`'s connection; `unit_state` records what
    they end (a refused start is the unit's result) and judges units the manager dropped."""

    def __init__(self, state: AgentState, link: ManagerLink, unit_state: UnitState):
        self.state, self.link, self.unit_state = state, link, unit_state

    def handle_bus(self) -> None:
        """Act on what the manager sent: replies to calls, and the UnitRemoved of known units (whose
        result is then in the journal or, a direct unit's, in the file its stop script left; else they
        are lost)."""
        s = self.state
        bus = s.bus
        if bus is None:  # not connected (callers check first): nothing to read
            return
        try:
            messages = bus.backlog + bus.read()
            bus.backlog = []
            bus.write()
        except OSError as exc:
            self.link.bus_lost(exc)
            return
        for message in messages:
            if message.path is not None:  # a PropertiesChanged of a unit whose end is ours to record
                self.unit_changed(message)
            elif message.kind == DBUS_SIGNAL and message.member == "UnitRemoved" and message.body:
                unit = str(message.body[0]).removesuffix(".service")
                if unit in s.units:
                    s.tracked.discard(unit)
                    s.removed.append(unit)
            elif message.kind == DBUS_SIGNAL and message.member == "JobRemoved" and len(message.body) == 4:
                unit = str(message.body[2]).removesuffix(".service")
                for name in s.held.pop(unit, ()):  # its start job is over: it runs, or ran
                    self.signal_direct(unit, name, "")
            elif message.reply_to in s.calls:
                self.answered(s.calls.pop(message.reply_to), message)
        if s.removed:
            self.unit_state.catch_up()
            self.unit_state.take_records(list(dict.fromkeys(s.removed)))  # their stop scripts' (systemd.STOP_RECORD)
            units = [u for u in dict.fromkeys(s.removed) if u in s.watched]
            s.removed.clear()
            known = self.unit_state.ask_systemd(units)
            for unit in units:
                if self.unit_state.report_if_finished(unit, known):
                    s.watched.discard(unit)

    def write_bus(self) -> None:
        """Send what waits in the connection's buffer, as far as the socket takes it now."""
        bus = self.state.bus
        if bus is None:
            return
        try:
            bus.write()
        except OSError as exc:
            self.link.bus_lost(exc)

    def unit_changed(self, message: DBusMessage) -> None:
        """Keep the last Service properties of a watched unit (undecoded: most are never read); on
        its Unit ones, record its result if it is over (systemd.unit_over)."""
        s = self.state
        unit = s.ends_by_path.get(message.path or "")
        if unit is None:
            return
        if message.interface != "org.freedesktop.systemd1.Unit":
            s.ends[unit] = message
            return
        service = s.ends.get(unit)
        if service is None:
            return
        active, sub = message.prop("ActiveState") or "", message.prop("SubState") or ""
        if active not in ("failed", "inactive") and sub != "exited":
            return
        props = {k: v for k in END_PROPERTIES if (v := service.prop(k)) is not None}
        if unit_over(active, sub, props):
            self.record_end(unit, active, props)

    def record_end(self, unit: str, active: str, props: dict) -> None:
        """Append the result of a unit that records none of its own (from its properties), then let
        systemd forget it (it is kept loaded until then: unit_properties)."""
        s = self.state
        self.link.forget_end(unit)
        self.unit_state.catch_up()
        u = s.units.get(unit)
        if u is not None and u.result is None:
            self.unit_state.record_ended(unit, u, props)
        self.link.release(unit, active)

    def agent_records(self, spec: dict) -> bool:
        """Whether this direct unit's end is recorded by the agent (no ExecStopPost): where the host
        asks for it (`--records agent`: its `unit_accounting: false`), for a job with no hooks (which need
        `post`), and no memory limit unless on cgroup v2 (systemd 252 tells an OOM kill, Result
        oom-kill, only there; elsewhere the stop script reads the v1 counter)."""
        s = self.state
        return (s.host.get("direct_records") == "agent" and not spec.get("hooks")
                and not (spec.get("mem_limit") and s.host.get("cgroup") != "v2"))

    def answered(self, call: tuple, message: DBusMessage) -> None:
        s = self.state
        what, unit = call[0], call[1]
        error = None
        if message.kind == DBUS_ERROR:
            error = f"{message.body[0] if message.body else ''} ({message.error})"
        if what == "start":
            s.starting.discard(unit)
            if error is None:
                s.accepted.add(unit)
                s.tracked.add(unit)
            else:
                self.start_failed(unit, f"systemd refused the unit: {error}")
        elif what == "attach":
            answer_tasks(call[2], error)
        elif what == "release":  # answered: done; refused: again (not on UnitRemoved, which a re-exec sends for all)
            if error is not None:
                self.link.release_failed(unit, message.error)
            else:
                self.link.released(unit)
        elif error is not None:
            print(f"agent: {what} of unit {unit} failed: {error}", file=sys.stderr)

    def start_unit(self, spec: dict, direct: bool) -> None:
        """Ask the manager to start the unit's transient service (the reply comes to handle_bus)."""
        s = self.state
        unit = spec["unit"]
        bus = self.link.connect_bus(now=True)
        if bus is None:
            self.start_failed(unit, f"cannot reach systemd at {manager_socket(s.mode, s.host.get('env', {}))}")
            return
        props = self.unit_properties(spec, direct)
        if direct and self.agent_records(spec):
            self.link.watch_end(unit)
        serial = bus.send("StartTransientUnit", "ssa(sv)a(sa(sv))", (f"{unit}.service", "fail", props, []))
        s.calls[serial] = ("start", unit)
        s.starting.add(unit)
        if direct:
            s.held[unit] = []

    def unit_properties(self, spec: dict, direct: bool) -> list:
        """The unit's transient service. Its command lines and properties hold only checked paths,
        names and numbers (see systemd.EXEC_SCRIPT), never the job's env, which any user of the host
        could read there: a direct unit's argv and env are in UNIT_DIR/job-env.sh, a supervisor's in
        UNIT_DIR/spec.json (both 0600). UMask is the job's submitter's, for the job's own files (ours
        have explicit modes). A supervisor's ExecStopPost runs `post` only if UNIT_DIR is still there
        (see recorders.UnitRecorder), through /bin/sh, which starts in 1 ms where Python takes 10."""
        s = self.state
        unit, host_dir = spec["unit"], spec["host_dir"]
        # A supervisor KILLs its job after the grace (systemd's stop timeout is its backstop); in a
        # direct unit systemd does, and the same timeout bounds the stop script: at least STOP_MARGIN.
        stop = max(spec["grace"], STOP_MARGIN) if direct else spec["grace"] + STOP_MARGIN
        if spec.get("hooks"):  # TimeoutStopSec bounds both the job's stop and each ExecStopPost
            stop = max(stop, hooks_budget(spec, "post") + STOP_MARGIN)
        props = [
            ("Type", ("s", "exec")), ("CollectMode", ("s", "inactive-or-failed")),
            ("KillMode", ("s", "control-group" if direct else "mixed")), ("TimeoutStopUSec", ("t", round(stop * 1e6))),
            ("UMask", ("u", job_umask(spec))),
        ]
        if spec.get("run_limit"):
            props.append(("RuntimeMaxUSec", ("t", round(spec["run_limit"] * 1e6))))
        if spec.get("mem_limit") and not spec["watch_mem_limit"]:
            props.append(("MemoryMax", ("t", int(spec["mem_limit"]))))
            if s.host.get("cgroup") == "v2":
                props.append(("MemorySwapMax", ("t", 0)))
        if not direct:
            tail = [s.python, "-S", "-E", s.code]
            post = [*tail, "post", host_dir]
            if os.path.exists("/bin/sh"):
                post = ["/bin/sh", "-c", f"test ! -d {host_dir} || exec {' '.join(post)}"]
            if hooks_budget(spec, "pre"):
                props += [("ExecStartPre", ("a(sasb)", [(s.python, [*tail, "pre", host_dir], False)])),
                          ("TimeoutStartUSec", ("t", round((hooks_budget(spec, "pre") + STOP_MARGIN) * 1e6)))]
            return props + [
                ("ExecStart", ("a(sasb)", [(s.python, [*tail, "exec", host_dir], False)])),
                ("ExecStopPost", ("a(sasb)", [(post[0], post, True)])),
            ]
        assert s.scripts is not None  # a direct unit: direct_unfit() found the scripts
        exec_script, stop_script = s.scripts
        limits = [format_limit(spec["run_limit"]) if spec.get("run_limit") else "-",
                  format_size(int(spec["mem_limit"])) if spec.get("mem_limit") else "-"]
        stop = ["sh", stop_script, unit, repr(spec["start_time"]), s.mode, *limits, str(s.boot_cs)]
        props += [
            # peak memory needs MemoryAccounting; CPU time comes from cgroup v2's cpu.stat, there without
            # CPUAccounting (which costs a v1 cpu cgroup: ~15 ms of a unit's life here), but on pure v1
            ("MemoryAccounting", ("b", True)), ("CPUAccounting", ("b", s.host.get("cgroup") == "v1")),
            # AttachProcessesToUnit (tasks of `xce launch`) needs delegation, but no controller of it:
            # DelegateControllers= empty is Delegate=yes with none. Measured (systemd 252, hybrid):
            # Delegate=yes with all of them doubles the manager's CPU per unit (+4.5 ms: a cgroup in
            # every v1 hierarchy); limits and accounting come from the properties that ask for them.
            ("DelegateControllers", ("as", [])),
            ("IgnoreSIGPIPE", ("b", False)),  # as a process started by the supervisor has it
            ("WorkingDirectory", ("s", spec["cwd"])),
            ("StandardOutputFileToAppend", ("s", spec["stdout"])),
        ]
        if spec.get("stderr"):
            props.append(("StandardErrorFileToAppend", ("s", spec["stderr"])))
        start = ("ExecStart", ("a(sasb)", [("/bin/sh", ["sh", exec_script, os.path.join(host_dir, ENV_FILE)], False)]))
        user = spec.get("user")
        if self.agent_records(spec):  # kept loaded once over, result and all, until the agent let it go
            props[1] = ("CollectMode", ("s", "inactive"))
            props += [("RemainAfterExit", ("b", True)), start]
            if user is None:
                return props
            return props + [("User", ("s", user["name"])), ("Group", ("s", str(user["gid"]))),
                            ("SupplementaryGroups", ("as", [str(g) for g in user["groups"]]))]
        if user is None:
            return props + [start, ("ExecStopPost", ("a(sasb)", [("/bin/sh", stop, True)]))]
        # As the job's user: systemd drops to them (and sets HOME, USER, LOGNAME) before ExecStart;
        # the stop script, which writes into our unit directory, keeps root's privileges ("+", the flag
        # "privileged"). The job's env file is theirs (it is their env); its directory, ours.
        return props + [
            ("User", ("s", user["name"])), ("Group", ("s", str(user["gid"]))),
            ("SupplementaryGroups", ("as", [str(g) for g in user["groups"]])),
            start, ("ExecStopPostEx", ("a(sasas)", [("/bin/sh", stop, ["ignore-failure", "privileged"])])),
        ]

    def signal_direct(self, unit: str, name: str, reason: str) -> bool:
        """A signal request for a direct unit, through systemd: TERM, INT and HUP stop the unit
        (TERM to all its processes, KILL after TimeoutStopSec), KILL kills them all and stops it
        (a stop cancels a start job still waiting: nothing runs), the others go to all its
        processes (KillUnit), once its start job is over (held until then: they would be lost).
        The reason for STOP_SCRIPT is left in the host directory first."""
        s = self.state
        if unit in s.held and name not in ("TERM", "INT", "HUP", "KILL"):
            s.held[unit].append(name)
            return True
        host_dir = os.path.join(s.units_dir, unit)
        try:
            if name in ("TERM", "INT", "HUP", "KILL"):
                write_file(os.path.join(host_dir, "kill_reason"), dumps(reason[:1000] or "killed"))
            elif name in ("USR1", "USR2"):
                write_file(os.path.join(host_dir, "signalled"), f"{name} ".encode() + dumps(reason[:1000] or None))
        except OSError as exc:
            print(f"agent: cannot note the reason for {unit} in {host_dir}: {exc}", file=sys.stderr)
        bus = self.link.connect_bus(now=True)
        if bus is None:
            raise Refused(f"systemd does not answer at {manager_socket(s.mode, s.host.get('env', {}))}; "
                          "try again")
        service = f"{unit}.service"
        if name not in ("TERM", "INT", "HUP"):
            signum = getattr(signal, f"SIG{name}")
            s.calls[bus.send("KillUnit", "ssi", (service, "all", signum))] = ("kill", unit)
        if name in ("TERM", "INT", "HUP", "KILL"):
            s.calls[bus.send("StopUnit", "ss", (service, "replace"))] = ("stop", unit)
        return True

    def direct_unfit(self, spec: dict) -> str | None:
        """Why this job cannot be its unit's main process (it then runs under the supervisor), or None."""
        s = self.state
        if s.scripts is None:
            return s.host["modes"][s.mode].get("direct_why") or "no direct units on this host"
        if spec["role"] != "job":
            return "a host unit runs no command: its supervisor holds the allocation and runs tasks"
        if spec.get("hooks"):
            return "its hooks run in Python steps (pre, post), which merge the supervisor's result"
        if spec.get("mem_limit") and spec["watch_mem_limit"]:
            return "systemd cannot enforce the memory limit here: the supervisor's RSS watch does"
        argv, env = spec["argv"], spec["env"]
        if len(argv) > 1000 or sum(len(a) for a in argv) + sum(len(k) + len(v) for k, v in env.items()) > 1 << 19:
            return "the job's argv and environment are too large for one D-Bus call"
        if not all(dbus_text_ok(text) for text in (*argv, *env.values(), spec["cwd"], spec["stdout"],
                                                    spec.get("stderr") or "/")):
            return "the job's argv, environment or paths hold bytes that are not UTF-8, which D-Bus cannot carry"
        if not all(k[0] not in "0123456789" and set(k) <= ENV_NAME_CHARS for k in env):
            return "an environment name systemd refuses (letters, digits and _ only, not first a digit)"
        if not all(normal_path(p) for p in (spec["cwd"], spec["stdout"], spec.get("stderr") or "/")):
            return "a path systemd refuses (not normalized: '//', '/./', '/../' or a trailing '/')"
        return None

    def start_failed(self, unit: str, why: str) -> None:
        """The unit never started: its result says why (unless it has one: its ExecStopPost may
        have come first), as for any finished unit."""
        s = self.state
        s.starting.discard(unit)
        self.link.forget_end(unit)
        self.unit_state.catch_up()
        u = s.units.get(unit)
        if u is not None and u.result is None:
            result = make_result(u.start_time or time.time(), why, mode=u.mode)
            self.unit_state.append(record("finished", unit=unit, result=result), sync=True)
            remove_unit_dir(os.path.join(s.units_dir, unit))

    def finish_starting(self) -> None:
        """Before exiting: wait (up to DBUS_TIMEOUT) for the manager's answer to every start sent,
        so that none the controller was told "started" is left unsent or unanswered."""
        s = self.state
        import select

        deadline = time.monotonic() + DBUS_TIMEOUT
        while s.bus is not None and s.starting and time.monotonic() < deadline:
            poller = select.poll()
            poller.register(s.bus.fileno(), select.POLLIN | (select.POLLOUT if s.bus.out else 0))
            poller.poll(100)
            self.handle_bus()

    def fork_tasks(self, unit: str, u: Unit) -> None:
        """Start the tasks just written to a direct unit's host directory: a supervisor for them is
        forked here, moved into the unit by systemd (AttachProcessesToUnit: its cgroup, so they
        are killed with it and count against its limits), and told to go on once it is there."""
        s = self.state
        assert u.direct is not None  # only direct units have a tasks' supervisor of their own
        host_dir = os.path.join(s.units_dir, unit)
        spec = {"unit": unit, "role": "tasks", "host_dir": host_dir, "mode": s.mode, **u.direct}
        old = os.umask(job_umask(spec))  # the tasks' supervisor, and the tasks, have the job's umask
        try:
            pid, go = fork_task_supervisor(JournalRecorder(s.spool, unit, s.boot), spec)
        finally:
            os.umask(old)
        s.task_children[pid] = unit
        bus = self.link.connect_bus(now=True)
        if bus is None:
            answer_tasks(go, "systemd does not answer")
            return
        serial = bus.send("AttachProcessesToUnit", "ssau", (f"{unit}.service", "", [pid]))
        s.calls[serial] = ("attach", unit, go)
