"""The Host seam's promises (exec/host.py) as tests that every implementation must pass.

`HostContract` holds the tests; its name does not start with `Test`, so pytest collects it only
where a module subclasses it and provides the fixture `host`: a `HostRig` around the Host under
test (test_host_contract.py runs it against LocalHost, SshHost to systemd test hosts and SshHost to
a plain test host). The rig passes the seam's calls through to the connected Host and adds what the
tests need: requests for jobs that wait for a release file, the events queue, reconnecting.

Jobs are small Python programs run by this interpreter (the test hosts share the file system), in
`workdir`, which this process and the host's jobs both see. Jobs that must stay running wait for a
release file and give up by themselves after a minute, so nothing outlives a failed test.
"""

from __future__ import annotations

import queue
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.agent_local import WAIT_JOB
from tests.support.waiting import wait_until
from xce_lite.errors import ExecError
from xce_lite.exec.host import Host, HostEvent, LaunchRequest, UnitFinished, UnitsLaunched

# A job that appends one line to a file each time it runs, then waits for its release file.
COUNTED_JOB = "import sys\nopen(sys.argv[3], 'a').write('ran\\n')\n" + WAIT_JOB


class HostRig:
    """A Host under test with what the contract needs around it. Attribute access that the rig does
    not define goes to the connected Host (`rig.launch(...)` is `rig.host.launch(...)`)."""

    def __init__(self, make: Callable[[], Host], workdir: Path) -> None:
        self.make, self.workdir = make, workdir
        self.events: queue.Queue[HostEvent] = queue.Queue()
        self.host = self.make()
        self.host.connect(self.events)

    def __getattr__(self, name: str):
        return getattr(self.host, name)

    def reconnect(self) -> Host:
        """Close the Host and connect a new one on the same spool, with the same events queue."""
        self.host.close()
        self.host = self.make()
        self.host.connect(self.events)
        return self.host

    def request(self, unit: str, argv: list[str], **fields) -> LaunchRequest:
        spec = {"env": {"PATH": "/usr/bin:/bin"}, "cwd": str(self.workdir),
                "stdout": str(self.workdir / f"{unit}.out"), "stderr": None}
        spec.update(fields)
        return LaunchRequest(unit=unit, argv=tuple(argv), **spec)

    def python(self, unit: str, code: str, *args: str, **fields) -> LaunchRequest:
        return self.request(unit, [sys.executable, "-c", code, *args], **fields)

    def waiter(self, unit: str, code: int = 0) -> LaunchRequest:
        """A unit that appends to `ran-UNIT` each time it runs, then waits for release(UNIT) and
        exits with `code`."""
        return self.python(unit, COUNTED_JOB, str(self.workdir / f"go-{unit}"), str(code),
                           str(self.workdir / f"ran-{unit}"))

    def release(self, unit: str) -> None:
        (self.workdir / f"go-{unit}").touch()

    def runs(self, unit: str) -> int:
        path = self.workdir / f"ran-{unit}"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def next_event(self, timeout: float = 30.0) -> HostEvent:
        return self.events.get(timeout=timeout)

    def finished(self, unit: str, timeout: float = 30.0) -> UnitFinished:
        """The next event, which must be UNIT's finished event."""
        event = self.next_event(timeout)
        assert isinstance(event, UnitFinished) and event.unit == unit, event
        return event

    def close(self) -> None:
        """Kill what still runs (and wait for it to end), then close the Host."""
        try:
            running = [u.unit for u in self.host.list_units() if u.status == "running"]
            for unit in running:
                self.host.signal(unit, "KILL", "test over")
            wait_until(lambda: not any(u.status == "running" for u in self.host.list_units()), 30,
                       f"the units {running} to end")
        finally:
            self.host.close()


class HostContract:
    """What every Host implementation promises; see exec/host.py for the contract in words."""

    def test_launch_starts_and_finishes_with_the_result(self, host: HostRig):
        [reply] = host.launch([host.python("u-exit", "import sys; print('hi'); sys.exit(3)")])
        assert reply.unit == "u-exit" and reply.status == "started" and reply.error is None
        event = host.finished("u-exit")
        assert event.host == host.name
        result = event.result
        assert result.exit_code == 3 and result.signal is None and result.reason is None
        assert reply.start_time is not None and result.start_time <= result.end_time
        assert (host.workdir / "u-exit.out").read_text() == "hi\n"
        [info] = host.list_units()
        assert (info.unit, info.status, info.result) == ("u-exit", "finished", result)

    def test_a_repeated_launch_adopts_and_never_runs_twice(self, host: HostRig):
        [first] = host.launch([host.waiter("u-once", 5)])
        wait_until(lambda: host.runs("u-once") == 1, 30, "the job to run")
        [again] = host.launch([host.waiter("u-once", 5)])
        assert again.status == "running" and again.start_time == first.start_time
        host.release("u-once")
        assert host.finished("u-once").result.exit_code == 5
        [after] = host.launch([host.waiter("u-once", 5)])
        assert after.status == "finished" and host.runs("u-once") == 1

    def test_signal_term_ends_the_job_with_the_reason(self, host: HostRig):
        host.launch([host.waiter("u-term")])
        wait_until(lambda: host.runs("u-term") == 1, 30, "the job to run")
        assert host.signal("u-term", "TERM", "killed by alice") is True
        result = host.finished("u-term").result
        assert result.reason == "killed by alice" and result.signal == signal.SIGTERM and result.exit_code is None
        assert host.signal("u-term", "TERM", "again") is False
        assert host.signal("u-nobody", "KILL", "none") is False

    def test_list_units_after_a_reconnect(self, host: HostRig):
        [started] = host.launch([host.waiter("u-long", 4), host.python("u-quick", "pass")])[:1]
        assert host.finished("u-quick").result.exit_code == 0
        host.reconnect()
        units = {u.unit: u for u in host.list_units()}
        assert units["u-long"].status == "running" and units["u-long"].start_time == started.start_time
        assert units["u-quick"].status == "finished" and units["u-quick"].result.exit_code == 0
        host.release("u-long")
        assert host.finished("u-long").result.exit_code == 4 and host.runs("u-long") == 1

    def test_forget_drops_finished_units_and_keeps_running_ones(self, host: HostRig):
        host.launch([host.python("u-done", "pass"), host.waiter("u-busy")])
        host.finished("u-done")
        host.forget(["u-done"])
        assert [u.unit for u in host.list_units()] == ["u-busy"]
        with pytest.raises(ExecError, match="still running"):
            host.forget(["u-busy"])
        assert [(u.unit, u.status) for u in host.list_units()] == [("u-busy", "running")]
        host.release("u-busy")
        host.finished("u-busy")

    def test_a_refused_launch_is_a_reply_with_the_reason(self, host: HostRig):
        bad = host.request("u-bad", ["true"], cwd=str(host.workdir / "nowhere"))
        [reply] = host.launch([bad])
        assert reply.status == "refused" and "nowhere" in reply.error and "not an existing directory" in reply.error
        assert host.list_units() == [] and host.events.empty()

    def test_launch_nowait_replies_come_before_any_event_of_those_units(self, host: HostRig):
        host.launch_nowait([host.python("u-fast", "pass"), host.request("u-cwd", ["true"], cwd="/nope")])
        first = host.next_event()
        assert isinstance(first, UnitsLaunched) and first.host == host.name
        assert [(r.unit, r.status) for r in first.replies] == [("u-fast", "started"), ("u-cwd", "refused")]
        assert host.finished("u-fast").result.exit_code == 0

    def test_close_leaves_jobs_running(self, host: HostRig):
        [started] = host.launch([host.waiter("u-stays", 7)])
        wait_until(lambda: host.runs("u-stays") == 1, 30, "the job to run")
        host.host.close()
        host.release("u-stays")  # the job ends while no agent listens; its result waits on the host
        host.reconnect()
        info = wait_until(lambda: [u for u in host.list_units() if u.status == "finished"], 30,
                          "the job to finish with no agent connected")[0]
        assert info.unit == "u-stays" and info.result.exit_code == 7 and info.start_time == started.start_time
        assert host.runs("u-stays") == 1
