"""`xce sim`: run, step through and verify simulations; turn a live store's history into a workload.

Light at import (click only): `xce_lite.cli.main` registers this group with one line, and `xce submit`
must not pay for the simulator. Each command parses, calls the library, prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from xce_lite.cli.base import JSON_OPTION, OUTPUT, Seconds, echo_json

EXISTING = click.Path(exists=True, dir_okay=False, path_type=Path)
INTERVAL = Seconds(min=0, max=1e7)  # 0: every instant; inf would never end


def _setup(config: Path, workload: Path, interval: float | None):
    from xce_lite.config.profiles import load_cluster
    from xce_lite.sim.engine import Simulator
    from xce_lite.sim.record import config_digest
    from xce_lite.sim.workload import load_workload

    cluster, profiles = load_cluster(config)
    sim = Simulator(cluster, profiles, load_workload(workload), interval)
    return sim, config_digest(cluster)


@click.group()
def sim() -> None:
    """The simulator: the real scheduler on a simulated clock and hosts.

    Example: xce sim run examples/sim/gpu/xce.yaml examples/sim/gpu/workload.yaml
    """


@sim.command()
@click.argument("config", type=EXISTING)
@click.argument("workload", type=EXISTING)
@click.option("--output", type=OUTPUT, help="Record every decision and the per-step accounting to this file.")
@click.option("--verify", type=EXISTING, help="Replay against this recording; report the first difference.")
@click.option("--interval", type=INTERVAL, help="Seconds between scheduling instants (default: controller.tick).")
@click.option("--load", "load", type=EXISTING, help="Start from a snapshot saved by --save or the REPL.")
@click.option("--stop-at", type=Seconds(min=0), help="Stop once the clock reaches this many seconds.")
@click.option("--save", type=OUTPUT, help="Save a snapshot of the state where the run stops.")
@click.option("--tick", is_flag=True, help="Run the controller's own tick (the default for a workload with "
              "`retry` or host events).")
@JSON_OPTION
def run(config: Path, workload: Path, output: Path | None, verify: Path | None, interval: float | None,
        load: Path | None, stop_at: float | None, save: Path | None, tick: bool, as_json: bool) -> None:
    """Run a workload on a cluster config to the end (or --stop-at) and print the summary:
    makespan, wait time percentiles per queue, utilisation per resource. Exit 1 if --verify
    finds a difference.

    Example: xce sim run xce.yaml workload.yaml --output run.rec && xce sim run xce.yaml workload.yaml --verify run.rec
    """
    from xce_lite.sim.batch import run_batch
    from xce_lite.sim.report import summary_json
    from xce_lite.sim.workload import load_workload

    loaded = load_workload(workload)
    if tick or loaded.needs_tick:
        _run_tick(config, loaded, interval, stop_at, as_json, output, verify,
                  [name for name, given in (("--load", load), ("--save", save)) if given])
        return
    sim_, config_hash = _setup(config, workload, interval)
    text, ok = run_batch(sim_, config_hash, output=output, verify=verify, load=load, stop_at=stop_at, save=save)
    if as_json:
        report = text.split("\nverify: ", 1)[-1]
        echo_json({**summary_json(sim_), "verify": None if verify is None else {"file": str(verify), "ok": ok,
                                                                                 "report": "verify: " + report}})
    else:
        click.echo(text)
    if not ok:
        sys.exit(1)


def _run_tick(config: Path, workload, interval: float | None, stop_at: float | None, as_json: bool,
              output: Path | None, verify: Path | None, refused: list[str]) -> None:
    """`run` by the controller's own tick (sim/ticked.py), recorded and verified as the core's run is."""
    import os

    from xce_lite.errors import SpecError
    from xce_lite.sim.record import Recorder, Verifier, config_digest, header
    from xce_lite.sim.report import summary_text
    from xce_lite.sim.ticked import TickSimulation

    if refused:
        why = ("; this workload has `retry` or host events, which only that tick simulates" if workload.needs_tick
               else "")
        raise SpecError(f"{', '.join(refused)}: snapshots are not made by the controller's tick yet{why}; run "
                        f"without {', '.join(refused)}")
    simulation = TickSimulation(config, workload, interval)
    recorder = partial = None
    try:
        head = {**header(config_digest(simulation.config), workload.digest, simulation.interval), "engine": "tick"}
        verifier = Verifier(verify, head) if verify is not None else None
        if output is not None:
            partial = output.with_name(output.name + ".partial")
            recorder = Recorder(open(partial, "w", encoding="utf-8"), head)
        while (t := simulation.next_instant()) is not None and (stop_at is None or t <= stop_at):
            simulation.step()
            assert simulation.last is not None  # set by every step
            if recorder is not None:
                recorder.write(simulation.last)
            if verifier is not None and not verifier.check(simulation.last):
                break
        if recorder is not None:
            recorder.close()
            recorder = None
            assert partial is not None and output is not None
            os.replace(partial, output)
        figures = simulation.summary_json()
    finally:
        if recorder is not None and partial is not None:  # failed midway: no half-written recording
            recorder.close()
            os.unlink(partial)
        simulation.close()
    ok = True
    report = None
    if verifier is not None:
        ok = verifier.done(simulation.steps) if stop_at is None else verifier.difference is None
        report = (f"verify: {'no difference' if ok else 'DIFFERENCE'} against {verify} ({verifier.checked} steps "
                  f"matched)" + ("" if ok else f"\n{verifier.difference}"))
    if as_json:
        echo_json({**figures, "verify": None if verify is None else {"file": str(verify), "ok": ok, "report": report}})
    else:
        click.echo(summary_text(figures) + ("" if report is None else "\n" + report))
    if not ok:
        sys.exit(1)


@sim.command()
@click.argument("config", type=EXISTING)
@click.argument("workload", type=EXISTING)
@click.option("--interval", type=INTERVAL, help="Seconds between scheduling instants (default: controller.tick).")
@click.option("--log", "log", type=OUTPUT, help="Also write one line per step to this scheduler log.")
def repl(config: Path, workload: Path, interval: float | None, log: Path | None) -> None:
    """Step through a simulation: commands on stdin (`help` lists them), a transcript on stdout.

    Example: printf 'trace on 1 full\\nstep 3\\ninfo jobs\\n' | xce sim repl xce.yaml workload.yaml
    """
    from xce_lite.sim.repl import Repl

    sim_, config_hash = _setup(config, workload, interval)
    shell = Repl(sim_, sys.stdout, config_hash, str(log) if log else None)
    sys.exit(shell.run(sys.stdin))


@sim.command()
@click.argument("out", type=OUTPUT)
@click.option("--since", type=Seconds(min=0), help="Only jobs submitted at or after this epoch time.")
@click.pass_context
def export(ctx: click.Context, out: Path, since: float | None) -> None:
    """Turn the cluster's job history (its store) into a workload, to replay under a changed config.

    Example: xce sim export last-month.yaml && xce sim run ~/.xce/xce.yaml last-month.yaml
    """
    from xce_lite.sim.export import export_workload

    count = export_workload(ctx.obj.require().store, out, since)
    click.echo(f"wrote {count} jobs to {out}")
