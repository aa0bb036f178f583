"""`xce web` as a test runs it: its own process on 127.0.0.1 and a free port, stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.browser import Browser
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until


@dataclass
class Web:
    process: subprocess.Popen
    link: str  # as printed: http://127.0.0.1:PORT/?token=...
    notice: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.link.split("?", 1)[0]

    @property
    def token(self) -> str:
        return self.link.split("token=", 1)[1] if "token=" in self.link else ""

    def get(self, path: str, token: bool = True) -> tuple[int, str]:
        """(status, body) of GET path, with the token as a Bearer header unless `token` is False."""
        request = urllib.request.Request(self.base + path.lstrip("/"))
        if token and self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process.stdout.close()


def start_web(cluster: Cluster, *args: str) -> Web:
    """Start `xce web --port 0 ARGS` and wait for the link it prints (the rest of its output is kept)."""
    process = subprocess.Popen([sys.executable, "-m", "xce_lite", "web", "--port", "0", *args], env=cluster.env,
                               cwd=cluster.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    wait_until(lambda: any("serving http" in line for line in lines) or process.poll() is not None, 60,
               "xce web to print its link")
    found = [line for line in lines if "serving http" in line]
    assert found, f"xce web exited {process.returncode}:\n" + "\n".join(lines)
    wait_until(lambda: any("Ctrl-C" in line for line in lines), 10, "the whole notice")
    return Web(process, found[0].split()[-1], lines)


@contextlib.contextmanager
def dashboard(cluster: Cluster, shots: Path) -> Iterator[tuple[Web, Browser]]:
    """`xce web` for the running cluster and a browser to look at it; both stopped at the end."""
    web = start_web(cluster)
    browser = None
    try:
        browser = Browser(shots)
        yield web, browser
    finally:
        if browser is not None:
            browser.close()
        web.stop()
