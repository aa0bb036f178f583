"""The host agent as a child process spoken to in its raw JSON-lines protocol (no xce_lite client
code): `RawAgent`, with the pids its journal records (`job_pid`, `supervisor_pid`) and builders of
a unit's spec (`unit`) and a Python job's argv (`py`). The agent runs from its bundle (`AGENT`),
with `python3 -S -E`, in plain mode unless told otherwise.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from pathlib import Path

from tests.support.agent_local import AGENT, PY, journal
from tests.support.waiting import wait_until


class RawAgent:
    """`agent.py serve` as a child process; request() sends one line and returns its reply.

    `on_event`, if set, is called with each event as it is read, before it is listed in `events`.
    `prefix` goes before the command (e.g. strace), `pass_fds` are fds the agent inherits, `env` its
    environment. The agent runs in plain mode unless `extra` says --mode.
    """

    def __init__(self, spool: Path, *extra: str, prefix: tuple[str, ...] = (), pass_fds: tuple[int, ...] = (),
                 env: dict[str, str] | None = None):
        self.spool = spool
        self.stderr = open(spool.parent / "agent.stderr", "ab")
        self.on_event = None
        mode = () if "--mode" in extra else ("--mode", "plain")
        self.proc = subprocess.Popen(
            [*prefix, PY, "-S", "-E", str(AGENT), "serve", "--spool", str(spool), *mode, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            start_new_session=True,
            pass_fds=pass_fds,
            env=env,
        )
        self.replies: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        self.eof = threading.Event()
        self.next_id = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            msg = json.loads(line)
            if "id" in msg:
                self.replies.put(msg)
                continue
            if self.on_event is not None:
                self.on_event(msg)
            self.events.append(msg)
        self.eof.set()

    def request(self, op: str, **fields) -> dict:
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"id": self.next_id, "op": op, **fields}).encode() + b"\n")
        self.proc.stdin.flush()
        reply = self.replies.get(timeout=20)
        assert reply["id"] == self.next_id
        return reply

    def launch(self, *units: dict) -> list[dict]:
        reply = self.request("launch", units=list(units))
        assert reply["ok"], reply
        return reply["replies"]

    def finished(self, unit: str, timeout: float = 20) -> dict:
        """Wait for the `finished` event of `unit`; its result."""

        def find():
            return next((e["result"] for e in self.events if e["event"] == "finished" and e["unit"] == unit), None)

        return wait_until(find, timeout, f"the finished event of {unit}")

    def close(self) -> int:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.reader.join(10)
        self.proc.stdout.close()
        self.stderr.close()
        return code


def job_pid(spool: Path, unit: str) -> int:
    """The pid of the unit's job, once its supervisor has recorded it."""
    return wait_until(lambda: journal(spool).get(unit, {}).get("job"), 10, f"the job pid of {unit}")


def supervisor_pid(spool: Path, unit: str) -> int:
    """The pid of the unit's supervisor, once it has recorded itself."""
    return wait_until(lambda: journal(spool).get(unit, {}).get("pid"), 10, f"the supervisor pid of {unit}")


def unit(name: str, argv: list[str], tmp: Path, **over) -> dict:
    spec = {
        "unit": name,
        "argv": argv,
        "env": {"PATH": os.environ["PATH"]},
        "cwd": str(tmp),
        "stdout": str(tmp / f"{name}.out"),
        "stderr": None,
        "run_limit": None,
        "mem_limit": None,
        "grace": 2,
    }
    spec.update(over)
    return spec


def py(code: str, *args: str) -> list[str]:
    return [PY, "-c", code, *args]
