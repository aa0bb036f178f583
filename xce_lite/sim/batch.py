"""Batch mode: a whole run (or up to a time), with its recording, its verification and its summary.

`run_batch` steps the simulator to the end (or `stop_at`), writes each step to the recording,
checks each against the one verified, saves a snapshot where it stops, and returns the summary
text and whether verification (if any) found no difference. The recording is written whole or not
at all: it goes to a temporary file beside it, renamed into place at the end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from xce_lite.errors import SpecError
from xce_lite.sim import report
from xce_lite.sim.engine import Simulator
from xce_lite.sim.record import Recorder, Verifier, canonical, header


def snapshot_text(sim: Simulator, head: dict) -> str:
    return canonical({"xce_sim_snapshot": 1, **head, "state": sim.state()}) + "\n"


def load_state(path: Path, head: dict) -> dict:
    """The state saved in a snapshot file of the same config, workload and interval."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SpecError(f"snapshot {path}: cannot read it ({err}); give a file `snapshot save` or --save wrote")
    if not isinstance(data, dict) or data.get("xce_sim_snapshot") != 1:
        raise SpecError(f"snapshot {path}: not a simulator snapshot; give a file `snapshot save` or --save wrote")
    for key in ("config", "workload", "interval"):
        if data.get(key) != head[key]:
            raise SpecError(f"snapshot {path} is of another {key} ({data.get(key)}; this run has {head[key]}): "
                            f"load it with the config and workload it was saved from")
    return data["state"]


def run_batch(sim: Simulator, config_hash: str, output: Path | None = None, verify: Path | None = None,
              load: Path | None = None, stop_at: float | None = None, save: Path | None = None) -> tuple[str, bool]:
    head = header(config_hash, sim.workload.digest, sim.interval)
    verifier = Verifier(verify, head) if verify is not None else None
    if load is not None:
        sim.restore(load_state(load, head))
    recorder, partial = None, None
    if output is not None:
        partial = output.with_name(output.name + ".partial")
        recorder = Recorder(open(partial, "w", encoding="utf-8"), {**head, "first_step": sim.step_number + 1})
    try:
        while (stop_at is None or (sim.next_instant() or 0) <= stop_at) and (step := sim.step()) is not None:
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
        save.write_text(snapshot_text(sim, head), encoding="utf-8")
    lines = [report.summary(sim)]
    ok = True
    if verifier is not None:
        ok = verifier.done(sim.step_number) if stop_at is None else verifier.difference is None
        lines.append(f"verify: {'no difference' if ok else 'DIFFERENCE'} against {verify} "
                     f"({verifier.checked} steps matched)" + ("" if ok else f"\n{verifier.difference}"))
    return "\n".join(lines), ok
