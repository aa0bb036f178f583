"""Recordings: every decision of a simulation, one JSON line per step, and verifying a run against one.

A recording starts with a header line (`{"xce_sim_recording": 2, "config": ..., "workload": ...,
"interval": ...}`: what it was made from), then one line per step: `Step.to_json()` (sim/ticked.py), i.e. what
was submitted or rejected, every dispatch with its attempt, hosts and task counts, what finished, was
requeued or cancelled, every pend reason that changed (full text), and the jobs pending and running.
Lines are canonical JSON (sorted keys, no spaces), so equal runs give equal bytes.

`Verifier` replays: it is fed each new step and compares it with the recorded line of the same
number; the first difference stops it with a report naming the step, its time, the field, the
recorded and the new value, and the recorded line before it as context. A recording of another
config or workload is refused up front, with both hashes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import IO

from xce_lite.errors import SpecError

FORMAT = 2  # 1: the core-only engine's steps, and the first tick's (no session, no counts)


def canonical(data: object) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_digest(config) -> str:
    """A hash of the cluster config as loaded (the model, not the file's comments)."""
    return hashlib.sha256(canonical(config.model_dump(mode="json")).encode()).hexdigest()[:16]


def header(config_hash: str, workload_hash: str, interval: float) -> dict:
    return {"xce_sim_recording": FORMAT, "config": config_hash, "workload": workload_hash, "interval": interval}


class Recorder:
    """Writes a recording to an open text file; `close` flushes it."""

    def __init__(self, out: IO[str], head: dict) -> None:
        self.out = out
        self.out.write(canonical(head) + "\n")

    def write(self, step_json: dict) -> None:
        self.out.write(canonical(step_json) + "\n")

    def close(self) -> None:
        self.out.close()


def read_recording(path: Path) -> tuple[dict, list[str]]:
    """(header, step lines); SpecError if the file is missing or is not a recording."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise SpecError(f"recording {path}: cannot read it ({err.strerror}); give a file `xce sim run --output` wrote")
    try:
        head = json.loads(lines[0]) if lines else None
    except ValueError:
        head = None
    if isinstance(head, dict) and head.get("xce_sim_recording") == 1:
        raise SpecError(f"recording {path} is of format 1, made by an older simulator (the core-only engine's, or "
                        f"the first tick's steps); record it again with `xce sim run CONFIG WORKLOAD --output FILE`")
    if not isinstance(head, dict) or head.get("xce_sim_recording") != FORMAT:
        raise SpecError(f"recording {path}: not a simulator recording (format {FORMAT}); "
                        f"make one with `xce sim run CONFIG WORKLOAD --output FILE`")
    return head, lines[1:]


class Verifier:
    """Compares steps with a recording (module docstring). `difference` is the first report, once
    there is one; `done(steps)` checks the run did not end before or after the recording."""

    def __init__(self, path: Path, head: dict) -> None:
        self.recorded_head, self.lines = read_recording(path)
        self.path = path
        for key in ("config", "workload", "interval"):
            made, now = self.recorded_head.get(key), head.get(key)
            if made != now:
                raise SpecError(f"recording {path} was made with {key} {made}, this run has {now}; verify against "
                                f"a recording of the same {key}")
        self.first = self.recorded_head.get("first_step", 1)  # `set output` in the REPL starts mid-run
        self.difference: str | None = None
        self.checked = 0

    def check(self, step_json: dict) -> bool:
        """False (and `difference` set) at the first step that differs from the recording."""
        if self.difference is not None:
            return False
        n = step_json["step"]
        if n < self.first:
            return True
        if n - self.first >= len(self.lines):
            self.difference = (f"step {n} (t={step_json['t']:g}): the run goes on past the recording's "
                               f"{len(self.lines)} steps")
            return False
        recorded = json.loads(self.lines[n - self.first])
        if recorded != json.loads(canonical(step_json)):
            self.difference = self._report(n, recorded, json.loads(canonical(step_json)))
            return False
        self.checked = n
        return True

    def done(self, steps: int) -> bool:
        last = self.first + len(self.lines) - 1
        if self.difference is None and steps < last:
            self.difference = f"the run ended after step {steps}; the recording goes on to step {last}"
        return self.difference is None

    def _report(self, n: int, recorded: dict, now: dict) -> str:
        field = next(k for k in sorted(set(recorded) | set(now)) if recorded.get(k) != now.get(k))
        was, got = recorded.get(field), now.get(field)
        detail = ""
        if isinstance(was, list) and isinstance(got, list):
            i = next((i for i, (a, b) in enumerate(zip(was, got)) if a != b), min(len(was), len(got)))
            detail = (f"\n  first differing entry #{i + 1}: recorded {canonical(was[i]) if i < len(was) else '(none)'}"
                      f"\n                          now      {canonical(got[i]) if i < len(got) else '(none)'}")
        index = n - self.first
        context = f"\n  the step before, as recorded: {self.lines[index - 1]}" if index >= 1 else ""
        return (f"step {n} (t={recorded.get('t', now.get('t')):g}) differs in {field}:\n"
                f"  recorded: {canonical(was)}\n  now:      {canonical(got)}{detail}{context}")
