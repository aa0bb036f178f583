"""The agent inside the systemd and plain test hosts, driven as the controller drives it: a
`HostAgent` (AgentOps over the agent's pipes, events kept so any order can be waited for), the
requests and jobs the tests launch there, hooks that log one line each, and the cleanup of units a
failed test left running.

Paths are shared: the hosts see this machine's file system (but /tmp), so spools, job directories
and logs live under `testhosts_root`. Unit names carry a random prefix, since the hosts outlive a
test. HOLD_JOB says it runs (its pid in a file), then waits for a release file (a minute at most).
"""

from __future__ import annotations

import queue
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.agent_local import journal
from tests.support.waiting import wait_until
from xce_lite import testhosts
from xce_lite.exec.agentops import AgentOps
from xce_lite.exec.channel import AgentChannel
from xce_lite.exec.host import HookRun, JobResult, LaunchRequest, UnitFinished
from xce_lite.exec.ssh import SshTarget

PY = "/usr/bin/python3"  # inside the hosts, for root and for the user alike

HOLD_JOB = (
    "import os, sys, time\n"
    "open(sys.argv[1] + '.running', 'w').write(str(os.getpid()))\n"
    "end = time.time() + 60\n"
    "while not os.path.exists(sys.argv[1]) and time.time() < end:\n"
    "    time.sleep(0.02)\n"
    "sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)\n"
)


def py(code: str, *args: str) -> list[str]:
    return [PY, "-c", code, *args]


def running(release: Path | str, timeout: float = 20) -> int:
    """Wait until the HOLD_JOB waiting for `release` runs; its pid (the host's)."""
    marker = Path(f"{release}.running")
    return wait_until(lambda: marker.exists() and marker.read_text() and int(marker.read_text()), timeout,
                      f"the job waiting for {release} to run")


class HostAgent(AgentOps):
    """agent.py serving inside a test host: `argv` runs it there; the ops are AgentOps'."""

    def __init__(self, name: str, argv: list[str], log: Path, run_as: testhosts.HostUser | None = None,
                 cwd: Path | None = None):
        self.name, self.run_as = name, run_as
        self.events: queue.Queue = queue.Queue()
        self.seen: list = []
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=cwd)
        self._channel = AgentChannel(self.proc.stdout, self.proc.stdin, self.events.put, name, timeout=30)
        try:
            self.hello = self.probe()
        except Exception:
            self.close()
            raise

    def event(self, match, describe: str, timeout: float = 30):
        """The first event `match` accepts (waiting for it); events are kept, so any order works."""

        def find():
            while True:
                try:
                    self.seen.append(self.events.get_nowait())
                except queue.Empty:
                    break
            return next((e for e in self.seen if match(e)), None)

        return wait_until(find, timeout, describe)

    def finished(self, unit: str, timeout: float = 30) -> JobResult:
        found = self.event(lambda e: isinstance(e, UnitFinished) and e.unit == unit, f"{unit} finished", timeout)
        return found.result

    def close(self) -> None:
        self._channel.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def shared_dir(root: Path, group: str) -> Path:
    """A fresh directory `root/group/<random>`, seen at the same path here and in the test hosts."""
    d = root / group / uuid.uuid4().hex[:8]
    d.mkdir(parents=True)
    return d


def name(base: str) -> str:
    """A unit name no other test (nor an earlier session) uses on the shared host."""
    return f"t{uuid.uuid4().hex[:8]}-{base}"


def request(unit: str, argv: list[str], cwd: Path | str, **over) -> LaunchRequest:
    fields = {"env": {"PATH": "/usr/bin:/bin"}, "stdout": f"{cwd}/{unit}.out", "stderr": None, "grace": 2.0}
    fields.update(over)
    return LaunchRequest(unit=unit, argv=tuple(argv), cwd=str(cwd), **fields)


def in_host(host: testhosts.TestHost, *argv: str) -> str:
    return subprocess.run(host.nsenter_argv(list(argv)), capture_output=True, text=True, timeout=30, check=True).stdout


def host_proc_state(host: testhosts.TestHost, pid: int) -> str | None:
    """The state letter of the host's process `pid` (pids in the journal are the host's own)."""
    done = subprocess.run(host.nsenter_argv(["cat", f"/proc/{pid}/stat"]), capture_output=True, text=True)
    return done.stdout.rsplit(")", 1)[1].split()[0] if done.returncode == 0 else None


def stop_leftovers(host: testhosts.TestHost, spool: Path, user: testhosts.HostUser | None) -> None:
    """Kill the units of `spool` that a failed test left running (their post hooks record them)."""
    for unit, state in journal(spool).items():
        if state["result"] is None:
            argv = ["systemctl", *(["--user"] if user else []), "kill", "-s", "KILL", f"{unit}.service"]
            subprocess.run(user.argv(argv) if user else host.nsenter_argv(argv), capture_output=True, timeout=30)


# One line per hook run: its point, layer, the job status and reason its env says, and whether it
# sees a variable of the job's own env (a profile's hook must not).
LOG_LINE = 'printf "%s %s %s|%s|%s %s\\n" "$XCE_HOOK" "$XCE_HOOK_LAYER" "$XCE_JOB_STATUS" "$XCE_JOB_REASON" ' \
           '"${JOB_ONLY:-profile-env}" "$XCE_JOBID" >> "$HOOK_LOG"'


def hook(point: str, log: Path, *, layer: str = "profile", then: str = "", timeout: float = 20) -> HookRun:
    """A hook that logs its line (HOOK_LOG is set for both layers by the test), then runs `then`."""
    script = LOG_LINE.replace('"$HOOK_LOG"', f"'{log}'") + (f"; {then}" if then else "")
    return HookRun(point, layer, ("/bin/sh", "-c", script), timeout)


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def ssh_target(test_host: testhosts.TestHost, root: Path, **fields) -> SshTarget:
    """A target that reaches a test host through the ssh config its harness wrote (HostName, User,
    IdentityFile, UserKnownHostsFile), with this interpreter as the host's python (shared file system)."""
    spec = {"ssh_config": str(test_host.ssh_config_path), "known_hosts": (),
            "accepted_keys": str(root / "accepted_keys"), "agent_dir": str(root / "agents"),
            "python": sys.executable, "connect_timeout": 10.0}
    spec.update(fields)
    return SshTarget(test_host.name, **spec)
