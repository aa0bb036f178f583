"""Batch mode: a whole run (or up to a time), with its recording, its verification and its summary.

`run_batch` steps the simulation to the end (or `stop_at`), writes each step to the recording,
checks each against the one verified, saves a snapshot where it stops, and returns the summary
text and figures, and whether verification (if any) found no difference. The recording and the
snapshot are written whole or not at all: each goes to a temporary file beside it, renamed into
place at the end.

A snapshot (format 2) is the run's header (config, workload, interval) and `TickSimulation.state()`:
where it was and a digest of every job there. Loading one replays the same inputs to that step and
checks the digest (sim/ticked.py), so what follows is exactly what the whole run did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from xce_lite.errors import SpecError
from xce_lite.sim import report
from xce_lite.sim.record import Recorder, Verifier, canonical, header
from xce_lite.sim.ticked import TickSimulation

SNAPSHOT_FORMAT = 2  # 1 was the core-only engine's, which is gone


def head_of(sim: TickSimulation, config_hash: str) -> dict:
    return {**header(config_hash, sim.workload.digest, sim.interval), "engine": "tick"}


def snapshot_text(sim: TickSimulation, head: dict) -> str:
    return canonical({"xce_sim_snapshot": SNAPSHOT_FORMAT, **head, "state": sim.state()}) + "\n"


def save_snapshot(sim: TickSimulation, head: dict, path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(snapshot_text(sim, head), encoding="utf-8")
    os.replace(partial, path)


def load_state(path: Path, head: dict) -> dict:
    """The state saved in a snapshot file of the same config, workload and interval."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SpecError(f"snapshot {path}: cannot read it ({err}); give a file `snapshot save` or --save wrote")
    if not isinstance(data, dict) or "xce_sim_snapshot" not in data:
        raise SpecError(f"snapshot {path}: not a simulator snapshot; give a file `snapshot save` or --save wrote")
    if data["xce_sim_snapshot"] != SNAPSHOT_FORMAT:
        raise SpecError(f"snapshot {path} is of format {data['xce_sim_snapshot']} (the core-only engine's, which "
                        f"is gone); run from the start, or save it again with this version")
    for key in ("config", "workload", "interval"):
        if data.get(key) != head[key]:
            raise SpecError(f"snapshot {path} is of another {key} ({data.get(key)}; this run has {head[key]}): "
                            f"load it with the config and workload it was saved from")
    if not isinstance(data.get("state"), dict):
        raise SpecError(f"snapshot {path}: it has no state; give a file `snapshot save` or --save wrote")
    return data["state"]


def run_batch(sim: TickSimulation, config_hash: str, output: Path | None = None, verify: Path | None = None,
              load: Path | None = None, stop_at: float | None = None,
              save: Path | None = None) -> tuple[str, dict, bool, str | None]:
    """(summary text, summary figures, verified ok, the verify report or None)."""
    head = head_of(sim, config_hash)
    verifier = Verifier(verify, head) if verify is not None else None
    if load is not None:
        sim.restore(load_state(load, head))
    recorder, partial = None, None
    if output is not None:
        partial = output.with_name(output.name + ".partial")
        recorder = Recorder(open(partial, "w", encoding="utf-8"), {**head, "first_step": sim.steps + 1})
    try:
        while (t := sim.next_instant()) is not None and (stop_at is None or t <= stop_at):
            step = sim.step()
            assert step is not None  # there was a next instant
            if recorder is not None:
                recorder.write(step.to_json())
            if verifier is not None and not verifier.check(step.to_json()):
                break
    except BaseException:
        if recorder is not None:
            recorder.close()
            assert partial is not None  # made with the recorder
            os.unlink(partial)
        raise
    if recorder is not None:
        recorder.close()
        assert partial is not None and output is not None  # made with the recorder
        os.replace(partial, output)
    if save is not None:
        save_snapshot(sim, head, save)
    figures = report.summary_json(sim)
    lines = [report.summary_text(figures)]
    ok, said = True, None
    if verifier is not None:
        ok = verifier.done(sim.steps) if stop_at is None else verifier.difference is None
        said = (f"verify: {'no difference' if ok else 'DIFFERENCE'} against {verify} ({verifier.checked} steps "
                f"matched)" + ("" if ok else f"\n{verifier.difference}"))
        lines.append(said)
    return "\n".join(lines), figures, ok, said
