"""A real one-host cluster for end-to-end tests: a home, a controller process, the `xce` CLI; its
hosts as `xce hosts` lists them (and a wait until all are ok), `HostOutage`, a local host made
unreachable for a while, and `running_cluster`, a started cluster for the span of a block.

Everything is real: the controller runs as its own process (`xce controller start`), its agent and
the jobs' supervisors are real processes, the store a real SQLite file. Teardown stops only what the
test started, by PID: the controller, then any supervisor still listed in the spool.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar


from tests.support.procs import zombie
from tests.support.waiting import wait_until
from xce_lite.testhosts.base import kill_tree
from xce_lite.exec.local import supervisor_pids


class Cluster:
    live: ClassVar[list[Cluster]] = []  # the clusters not yet closed: a failed test's report shows their logs
    # (home, report()) of each cluster a `running_cluster` block closed on its way out of a failure:
    # its files are gone by the time the test's report is made (tests/conftest.py shows these)
    failed: ClassVar[list[tuple[Path, str]]] = []

    def __init__(self, slots: int = 2, grace: str = "2s", config: str | None = None, work: Path | None = None):
        """`work`: where jobs run and write (default: beside the home, under /tmp); jobs on test hosts
        need a directory outside /tmp, which each host has a private copy of."""
        # A short path: a Unix socket path must fit in 107 bytes, and pytest's tmp_path may not.
        self.root = Path(tempfile.mkdtemp(prefix="xce-test-"))
        self.home = self.root / "home"
        self.work = work or self.root / "work"
        self.home.mkdir()
        self.work.mkdir(parents=True, exist_ok=True)
        (self.home / "xce.yaml").write_text(textwrap.dedent(config) if config else textwrap.dedent(f"""\
            cluster: t{os.getpid()}
            hosts:
              - name: local
                slots: {slots}
                mem: 1G
            queues:
              - name: normal
                default: true
              - name: high
                priority: 50
            controller:
              tick: 1s
              grace: {grace}
            """))
        self.env = dict(os.environ, XCE_HOME=str(self.home))
        # more of what a failed test's report shows (report()): e.g. a test host's side (remote.py)
        self.reporters: list[Callable[[], str]] = []
        Cluster.live.append(self)

    # ---- the CLI --------------------------------------------------------------------------------

    def xce(self, *args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None,
            ) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "xce_lite", *args], cwd=cwd or self.work,
                              env=env or self.env, capture_output=True, text=True, timeout=timeout)

    def ok(self, *args: str, **kw) -> str:
        result = self.xce(*args, **kw)
        assert result.returncode == 0, f"xce {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
        return result.stdout

    def submit(self, *command: str, options: tuple[str, ...] = ()) -> int:
        return int(self.ok("submit", "--parsable", *options, "--", *command).strip())

    def job(self, job_id: int) -> dict:
        """The row of job `job_id`; of an array's first element too (its id is the array's)."""
        rows = json.loads(self.ok("jobs", "--json", "--elements", str(job_id)))["jobs"]
        found = [j for j in rows if j["id"] == job_id]
        assert found, f"`xce jobs {job_id}` lists no job {job_id}: {[j['id'] for j in rows]}"
        return found[0]

    def wait_state(self, job_id: int, states: set[str], timeout: float = 30) -> dict:
        found: dict = {}

        def reached() -> bool:
            found.update(self.job(job_id))
            return found["state"] in states

        wait_until(reached, timeout, f"job {job_id} to reach {sorted(states)} (last: {found.get('state')})")
        return found

    # ---- the controller ---------------------------------------------------------------------------

    def start(self) -> None:
        self.ok("controller", "start")

    @property
    def controller_pid(self) -> int | None:
        try:
            text = (self.home / "controller.lock").read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() and Path(f"/proc/{text}").exists() else None

    def kill9_controller(self) -> None:
        pid = self.controller_pid
        assert pid is not None, "no controller to kill"
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: zombie(pid), 10, f"controller {pid} to die")

    def supervisor_pids(self) -> list[int]:
        """The supervisors still running on this cluster's local hosts (from each spool's journal)."""
        spools = (self.home / "spool").glob("*/") if (self.home / "spool").is_dir() else []
        return [pid for spool in spools for pid in supervisor_pids(spool)]

    def log_tail(self, lines: int = 200) -> str:
        """The last `lines` of the controller's log (what a failed test's report shows)."""
        try:
            text = (self.home / "controller.log").read_text(errors="replace")
        except FileNotFoundError:
            return "(no controller log)"
        return "\n".join(text.splitlines()[-lines:])

    def report(self) -> str:
        """What a failed test's report shows of this cluster: the last lines of the controller's log
        and of each agent's (local, and SSH hosts' stderr as it reached the controller), the last
        records of each local host's journal (kind and unit), and what `reporters` add."""
        parts = [self.log_tail()]
        spools = self.home / "spool"
        for log in [*sorted(spools.glob("agent-*.log")), *sorted(self.home.glob("agent-*.log"))]:
            lines = log.read_text(errors="replace").splitlines()[-20:]
            parts.append(f"---- {log.name} (its last lines)\n" + "\n".join(lines))
        for journal in sorted(spools.glob("*/journal")):
            records = []
            for line in journal.read_text(errors="replace").splitlines()[-40:]:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                after = (rec.get("spec") or {}).get("after")  # a queued successor's predecessor
                words = [rec.get("event"), rec.get("unit"), after and f"after {after}", rec.get("reason")]
                records.append(" ".join(str(w) for w in words if w))
            parts.append(f"---- {journal.parent.name}'s journal (its last records)\n" + "\n".join(records))
        for reporter in self.reporters:
            try:
                parts.append(reporter())
            except Exception as exc:  # a report must not hide the failure it reports
                parts.append(f"---- {reporter!r} failed: {exc!r}")
        return "\n".join(parts)

    def keep_report(self) -> None:
        """Keep this cluster's report for the failing test's (once): its files go with close()."""
        if all(home != self.home for home, _text in Cluster.failed):
            Cluster.failed.append((self.home, self.report()))

    def close(self) -> None:
        if sys.exc_info()[0] is not None:  # closed on a failure's way out (a test's `finally`)
            self.keep_report()
        if self in Cluster.live:
            Cluster.live.remove(self)
        pid = self.controller_pid
        if pid is not None:
            self.xce("controller", "stop", timeout=40)
            if not zombie(pid):
                os.kill(pid, signal.SIGKILL)
        for sup in self.supervisor_pids():
            kill_tree(sup)
        shutil.rmtree(self.root, ignore_errors=True)


class HostOutage:
    """Host `name` of cluster `c` out of reach: its agent killed, its spool locked by us."""

    def __init__(self, c: Cluster, name: str):
        self.lock_path = c.home / "spool" / name / ".lock"
        self.fd = -1

    def __enter__(self) -> HostOutage:
        pid = int(self.lock_path.read_text().split()[0])  # the serving agent writes its pid there
        self.fd = os.open(self.lock_path, os.O_RDWR)
        os.kill(pid, signal.SIGKILL)
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # as soon as the killed agent's lock is gone
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # the next agent takes the lock: the host is back


def hosts_of(c: Cluster) -> dict[str, dict]:
    return {h["name"]: h for h in json.loads(c.ok("hosts", "--json"))["hosts"]}


def hosts_ok(c: Cluster, describe: str, timeout: float = 60) -> None:
    """Wait until every host of `c` is ok (`describe` says which; the message on timeout names each
    host's state and why it is not ok: an agent that cannot start says so there)."""
    seen: dict[str, dict] = {}

    def all_ok() -> bool:
        seen.clear()
        seen.update(hosts_of(c))
        return all(h["state"] == "ok" for h in seen.values())

    try:
        wait_until(all_ok, timeout, describe)
    except AssertionError as exc:
        states = {name: (h["state"], h.get("unreach_why") or h.get("trouble")) for name, h in seen.items()}
        raise AssertionError(f"{exc}; hosts: {states}") from None


@contextmanager
def running_cluster(**kw) -> Iterator[Cluster]:
    """A started `Cluster(**kw)` for the block; closed after it, also when its start fails."""
    c = Cluster(**kw)
    try:
        c.start()
        yield c
    except BaseException:
        c.keep_report()  # read now: close() removes its files
        raise
    finally:
        c.close()
