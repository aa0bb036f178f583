"""A throw-away xce_lite cluster for the benchmark: a temp home, one local host, a real controller.

The home lives under a short mkdtemp path in /tmp (a Unix socket path must fit in 107 bytes). The
controller is started with `python -m xce_lite --home H controller start` and stopped with
`... controller stop`. Everything this cluster started is then ended BY PID, never by name:
the controller (if it ignored the stop), the processes that were its descendants while it ran
(the host agent, the scheduler's forkserver and pool), and any job supervisor still listed in the
spool together with its job.
"""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

from stats import machine_busy_seconds  # noqa: F401  (re-exported: the benches import it from here)

# Measure the tree this file is in, not whatever `pip install` put in site-packages: this process
# imports from it, and so do the controllers and agents it starts.
ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
# Measure it as installed: `pip install .` writes the bytecode, but a source tree run with
# PYTHONDONTWRITEBYTECODE=1 (as on the build machines) has none, and a controller that compiles its
# ~150 modules at every start holds ~7 MB more RSS from it, which is the compiler's, not ours.
compileall.compile_dir(str(Path(ROOT) / "xce_lite"), quiet=1)

from xce_lite.testhosts.base import kill_tree
from xce_lite.api.client import Client
from xce_lite.exec.local import supervisor_pids


def _write_config(home: Path, slots: int, tick: str, grace: str, prefill: bool | None) -> None:
    (home / "xce.yaml").write_text(textwrap.dedent(f"""\
        cluster: b{os.getpid()}
        hosts:
          - name: local
            slots: {slots}
            mem: 1G
        queues:
          - name: normal
            default: true
        controller:
          tick: {tick}
          grace: {grace}
        """) + ("" if prefill is None else f"  prefill: {str(prefill).lower()}\n"))


class BenchCluster:
    def __init__(self, slots: int = 2, tick: str = "1s", grace: str = "2s", config: str | None = None,
                 work: Path | None = None, prefill: bool | None = None):
        """`config`: the whole xce.yaml (default: one local host of `slots`, `prefill` as given, else
        the default); `work`: where jobs run (default: beside the home in /tmp; jobs on test hosts
        need one outside /tmp)."""
        self.root = Path(tempfile.mkdtemp(prefix="xb-", dir="/tmp"))
        self.home = self.root / "h"
        self.work = work or self.root / "w"
        self.home.mkdir()
        self.work.mkdir(parents=True, exist_ok=True)
        self.out = str(self.work / "out")  # every job's stdout and stderr: one shared junk file
        if config is None:
            _write_config(self.home, slots, tick, grace, prefill)
        else:
            (self.home / "xce.yaml").write_text(config)
        if len(os.fsencode(self.socket)) > 107:
            raise RuntimeError(f"socket path too long: {self.socket}")
        self.env = dict(os.environ, XCE_HOME=str(self.home))
        self.pid: int | None = None
        self._known: dict[int, float] = {}  # pid -> create_time of every descendant we saw
        self._client: Client | None = None

    @property
    def socket(self) -> Path:
        return self.home / "xce.sock"

    def xce(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "xce_lite", "--home", str(self.home), *args], check=False,
                              cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self) -> None:
        result = self.xce("controller", "start")
        if result.returncode != 0:
            raise RuntimeError(f"controller start failed: {result.stdout}{result.stderr}")
        self.pid = int(self.client().get("/status")["pid"])
        self.remember_children()

    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.socket, timeout=600)
        return self._client

    def new_client(self) -> Client:
        return Client(self.socket, timeout=600)

    def remember_children(self) -> None:
        """Note the controller's descendants (agent, forkserver, pool) so we can end them by PID."""
        if self.pid is None:
            return
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                try:
                    self._known[child.pid] = child.create_time()
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            pass

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True) if self.pid else []
        except psutil.NoSuchProcess:
            return []

    def spec(self, argv: list[str], **extra) -> dict:
        return {"argv": argv, "cwd": str(self.work), "stdout": self.out,
                "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **extra}

    def stop(self) -> None:
        """Stop the controller, then end by PID whatever it left that we started."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.pid is not None:
            self.remember_children()
            try:
                self.xce("controller", "stop", timeout=45)
            except subprocess.TimeoutExpired:
                pass
            _end(self.pid, None)
        for pid, created in self._known.items():
            _end(pid, created)
        spools = (self.home / "spool").glob("*/") if (self.home / "spool").is_dir() else []
        for sup in (pid for spool in spools for pid in supervisor_pids(spool)):
            kill_tree(sup)
        self.pid = None
        shutil.rmtree(self.root, ignore_errors=True)


def _same(pid: int, created: float | None) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 0.01:
            return None  # the pid was reused by someone else: not ours
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.NoSuchProcess:
        return None


def _end(pid: int, created: float | None, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace`, one process we started (checked by its start time)."""
    proc = _same(pid, created)
    if proc is None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace)
    except psutil.TimeoutExpired:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    except psutil.NoSuchProcess:
        pass


def is_agent(argv: list[str]) -> bool:
    """A host agent's command line: `python -S -E .../agent-<hash>.py serve ...` as it is started, or
    `.../bin/agent-<hash>.<tag>.pyc serve ...` once it runs on from its bytecode (same pid)."""
    name = os.path.basename(argv[3]) if len(argv) > 4 else ""
    return name.startswith("agent-") and name.endswith((".py", ".pyc")) and argv[4] == "serve"


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM / VmRSS / ... of /proc/PID/status in bytes."""
    found = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith(("Vm", "Rss")):
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    found[key] = int(parts[0]) * 1024
    return found


def pss(pid: int) -> int:
    """Proportional set size in bytes (/proc/PID/smaps_rollup), 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def wait_done(client: Client, ids: list[int], deadline: float, brief: bool = True) -> dict | None:
    """Long-poll /jobs/wait until every job has finished; the last reply, or None past `deadline`.
    `brief` (unless False): the reply counts the jobs per state ("states") instead of listing them
    ("jobs"), as `xce wait -q` asks: all a throughput figure waits for (the records of 1,000 jobs
    took ~70 ms to read, encode and decode, in every figure's wall and CPU; HyperQueue's is taken
    from its last task's own clock, its client's wait aside)."""
    text = ",".join(map(str, ids))
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        reply = client.get("/jobs/wait", ids=text, timeout=min(60.0, max(1.0, left)), brief=brief)
        if reply["finished"]:
            return reply


def wait_idle(c: BenchCluster, timeout: float = 60.0) -> None:
    """Until the controller holds no pending or active job (and has had a moment to settle)."""
    client = c.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = client.get("/status")["jobs"]
        if jobs["pending"] == 0 and jobs["active"] == 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)


def warm(c: BenchCluster, jobs: int = 20) -> None:
    """Run `jobs` `true` jobs to the end on a started cluster, then let it settle a second: the
    controller, its scheduler worker, the agent and its reused supervisors are up before a figure."""
    client = c.client()
    wait_done(client, client.post("/jobs", {"jobs": [c.spec(["true"])] * jobs})["ids"], time.monotonic() + 60)
    time.sleep(1)
