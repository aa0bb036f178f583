"""The Agent's side of systemd (part of the Agent, server.py): one connection to the manager's
private socket, the calls on it (start, stop, kill, attach) and what comes back, read on the
serve loop's poll(); and what each unit is made of (its transient service's properties).

Invariant: the agent never waits for the manager, but for its answers to the starts it asked for
before exiting (finish_starting); a call systemd refuses is the unit's result.
"""

from __future__ import annotations

import os
import sys
import time

from .base import AgentBase
from .dbus import DBUS_ERROR, DBUS_SIGNAL, DBUS_TIMEOUT, Bus, DBusMessage, manager_socket
from .hooks import hooks_budget
from .journal import Unit, record
from .recorders import JournalRecorder
from .supervisor import fork_task_supervisor
from .systemd import ENV_FILE, STOP_MARGIN
from .runas import remove_unit_dir
from .util import format_limit, format_size, job_umask, make_result
from .validate import ENV_NAME_CHARS, dbus_text_ok, normal_path


class Manager(AgentBase):
    """The Agent's methods that speak to systemd (the attributes are the Agent's)."""

    def connect_bus(self, now: bool = False) -> Bus | None:
        """Reach the manager's private socket, unless connected (tried at most once a second while
        it does not answer, unless `now`); the connection (self.bus), or None if there is none."""
        if self.bus is not None:
            return self.bus
        if self.mode == "plain" or (time.monotonic() < self.next_connect and not now):
            return None
        path = manager_socket(self.mode, self.host.get("env", os.environ))
        try:
            self.bus = bus = Bus(path, timeout=2.0)
        except OSError as exc:
            self.next_connect = time.monotonic() + 1.0
            print(f"agent: cannot reach the manager at {path} ({exc}); trying again", file=sys.stderr)
            return None
        if self.poller is not None:
            self.poller.register(bus.fileno(), 1)  # POLLIN
        return bus

    def bus_lost(self, exc: Exception) -> None:
        """The manager closed the connection (as it does when it re-executes itself) or broke it:
        what it did not answer is unknown, and what it tracked is doubtful, until it is asked again
        (poll_watched does, reconnecting)."""
        print(f"agent: lost the connection to the manager ({exc}); reconnecting", file=sys.stderr)
        bus, self.bus = self.bus, None
        if bus is not None:
            if self.poller is not None:
                self.poller.unregister(bus.fileno())
            bus.close()
        for what, unit, *extra in self.calls.values():
            if what == "start":
                self.starting.discard(unit)
            elif what == "attach":
                self.answer_tasks(extra[0], "the connection to systemd was lost")
        self.calls.clear()
        self.tracked.clear()
        self.held.clear()  # their JobRemoved will not come: a signal now goes straight to systemd

    def handle_bus(self) -> None:
        """Act on what the manager sent: replies to calls, and the UnitRemoved of known units (whose
        result is then in the journal, or they are lost)."""
        bus = self.bus
        if bus is None:  # not connected (callers check first): nothing to read
            return
        try:
            messages = bus.backlog + bus.read()
            bus.backlog = []
            bus.write()
        except OSError as exc:
            self.bus_lost(exc)
            return
        for message in messages:
            if message.kind == DBUS_SIGNAL and message.member == "UnitRemoved" and message.body:
                unit = str(message.body[0]).removesuffix(".service")
                if unit in self.units:
                    self.tracked.discard(unit)
                    self.removed.append(unit)
            elif message.kind == DBUS_SIGNAL and message.member == "JobRemoved" and len(message.body) == 4:
                unit = str(message.body[2]).removesuffix(".service")
                for name in self.held.pop(unit, ()):  # its start job is over: it runs, or ran
                    self.signal_direct(unit, name, "")
            elif message.reply_to in self.calls:
                self.answered(self.calls.pop(message.reply_to), message)
        if self.removed:
            self.catch_up()
            units = [u for u in dict.fromkeys(self.removed) if u in self.watched]
            self.removed.clear()
            known = self.ask_systemd(units)
            for unit in units:
                if self.report_if_finished(unit, known):
                    self.watched.discard(unit)

    def answered(self, call: tuple, message: DBusMessage) -> None:
        what, unit = call[0], call[1]
        error = None
        if message.kind == DBUS_ERROR:
            error = f"{message.body[0] if message.body else ''} ({message.error})"
        if what == "start":
            self.starting.discard(unit)
            if error is None:
                self.accepted.add(unit)
                self.tracked.add(unit)
            else:
                self.start_failed(unit, f"systemd refused the unit: {error}")
        elif what == "attach":
            self.answer_tasks(call[2], error)
        elif error is not None:
            print(f"agent: {what} of unit {unit} failed: {error}", file=sys.stderr)

    def start_unit(self, spec: dict, direct: bool) -> None:
        """Ask the manager to start the unit's transient service (the reply comes to handle_bus)."""
        unit = spec["unit"]
        bus = self.connect_bus(now=True)
        if bus is None:
            self.start_failed(unit, f"cannot reach systemd at {manager_socket(self.mode, self.host.get('env', {}))}")
            return
        props = self.unit_properties(spec, direct)
        serial = bus.send("StartTransientUnit", "ssa(sv)a(sa(sv))", (f"{unit}.service", "fail", props, []))
        self.calls[serial] = ("start", unit)
        self.starting.add(unit)
        if direct:
            self.held[unit] = []

    def unit_properties(self, spec: dict, direct: bool) -> list:
        """The unit's transient service. Its command lines and properties hold only checked paths,
        names and numbers (see systemd.EXEC_SCRIPT), never the job's env, which any user of the host
        could read there: a direct unit's argv and env are in UNIT_DIR/job-env.sh, a supervisor's in
        UNIT_DIR/spec.json (both 0600). UMask is the job's submitter's, for the job's own files (ours
        have explicit modes). A supervisor's ExecStopPost runs `post` only if UNIT_DIR is still there
        (see recorders.UnitRecorder), through /bin/sh, which starts in 1 ms where Python takes 10."""
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
            if self.host.get("cgroup") == "v2":
                props.append(("MemorySwapMax", ("t", 0)))
        if not direct:
            tail = [self.python, "-S", "-E", self.code]
            post = [*tail, "post", host_dir]
            if os.path.exists("/bin/sh"):
                post = ["/bin/sh", "-c", f"test ! -d {host_dir} || exec {' '.join(post)}"]
            if hooks_budget(spec, "pre"):
                props += [("ExecStartPre", ("a(sasb)", [(self.python, [*tail, "pre", host_dir], False)])),
                          ("TimeoutStartUSec", ("t", round((hooks_budget(spec, "pre") + STOP_MARGIN) * 1e6)))]
            return props + [
                ("ExecStart", ("a(sasb)", [(self.python, [*tail, "exec", host_dir], False)])),
                ("ExecStopPost", ("a(sasb)", [(post[0], post, True)])),
            ]
        assert self.scripts is not None  # a direct unit: direct_unfit() found the scripts
        exec_script, stop_script = self.scripts
        limits = [format_limit(spec["run_limit"]) if spec.get("run_limit") else "-",
                  format_size(int(spec["mem_limit"])) if spec.get("mem_limit") else "-"]
        stop = ["sh", stop_script, unit, repr(spec["start_time"]), self.mode, *limits, str(self.boot_cs)]
        props += [
            # peak memory needs MemoryAccounting; CPU time comes from cgroup v2's cpu.stat, there without
            # CPUAccounting (which costs a v1 cpu cgroup: ~15 ms of a unit's life here), but on pure v1
            ("MemoryAccounting", ("b", True)), ("CPUAccounting", ("b", self.host.get("cgroup") == "v1")),
            ("Delegate", ("b", True)),  # AttachProcessesToUnit (tasks of `xce launch`) needs it
            ("IgnoreSIGPIPE", ("b", False)),  # as a process started by the supervisor has it
            ("WorkingDirectory", ("s", spec["cwd"])),
            ("StandardOutputFileToAppend", ("s", spec["stdout"])),
        ]
        if spec.get("stderr"):
            props.append(("StandardErrorFileToAppend", ("s", spec["stderr"])))
        start = ("ExecStart", ("a(sasb)", [("/bin/sh", ["sh", exec_script, os.path.join(host_dir, ENV_FILE)], False)]))
        user = spec.get("user")
        if user is None:
            return props + [start, ("ExecStopPost", ("a(sasb)", [("/bin/sh", stop, True)]))]
        # As the job's user: systemd drops to them (and sets HOME, USER, LOGNAME) before ExecStart;
        # the stop script, which appends to our journal, keeps root's privileges ("+", the flag
        # "privileged"). The job's env file is theirs (it is their env); its directory, ours.
        return props + [
            ("User", ("s", user["name"])), ("Group", ("s", str(user["gid"]))),
            ("SupplementaryGroups", ("as", [str(g) for g in user["groups"]])),
            start, ("ExecStopPostEx", ("a(sasas)", [("/bin/sh", stop, ["ignore-failure", "privileged"])])),
        ]

    def direct_unfit(self, spec: dict) -> str | None:
        """Why this job cannot be its unit's main process (it then runs under the supervisor), or None."""
        if self.scripts is None:
            return self.host["modes"][self.mode].get("direct_why") or "no direct units on this host"
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
        self.starting.discard(unit)
        self.catch_up()
        u = self.units.get(unit)
        if u is not None and u.result is None:
            result = make_result(u.start_time or time.time(), why, mode=u.mode)
            self.append(record("finished", unit=unit, result=result), sync=True)
            remove_unit_dir(os.path.join(self.units_dir, unit))

    def finish_starting(self) -> None:
        """Before exiting: wait (up to DBUS_TIMEOUT) for the manager's answer to every start sent,
        so that none the controller was told "started" is left unsent or unanswered."""
        import select

        deadline = time.monotonic() + DBUS_TIMEOUT
        while self.bus is not None and self.starting and time.monotonic() < deadline:
            poller = select.poll()
            poller.register(self.bus.fileno(), select.POLLIN | (select.POLLOUT if self.bus.out else 0))
            poller.poll(100)
            self.handle_bus()

    def fork_tasks(self, unit: str, u: Unit) -> None:
        """Start the tasks just written to a direct unit's host directory: a supervisor for them is
        forked here, moved into the unit by systemd (AttachProcessesToUnit: its cgroup, so they
        are killed with it and count against its limits), and told to go on once it is there."""
        assert u.direct is not None  # only direct units have a tasks' supervisor of their own
        host_dir = os.path.join(self.units_dir, unit)
        spec = {"unit": unit, "role": "tasks", "host_dir": host_dir, "mode": self.mode, **u.direct}
        old = os.umask(job_umask(spec))  # the tasks' supervisor, and the tasks, have the job's umask
        try:
            pid, go = fork_task_supervisor(JournalRecorder(self.spool, unit, self.boot), spec)
        finally:
            os.umask(old)
        self.task_children[pid] = unit
        bus = self.connect_bus(now=True)
        if bus is None:
            self.answer_tasks(go, "systemd does not answer")
            return
        serial = bus.send("AttachProcessesToUnit", "ssau", (f"{unit}.service", "", [pid]))
        self.calls[serial] = ("attach", unit, go)

    @staticmethod
    def answer_tasks(go: int, error: str | None) -> None:
        """Tell a tasks' supervisor that it is inside its unit (error None), or why it is not."""
        try:
            os.write(go, b"ok" if error is None else b"no " + error.encode("utf-8", "replace")[:400])
        except OSError:
            pass
        os.close(go)
