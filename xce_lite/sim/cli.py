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
    from xce_lite.sim.record import config_digest
    from xce_lite.sim.ticked import TickSimulation
    from xce_lite.sim.workload import load_workload

    loaded = load_workload(workload)
    cluster, _profiles = load_cluster(config)  # a config error is said before the controller starts
    return TickSimulation(config, loaded, interval), config_digest(cluster)


@click.group()
def sim() -> None:
    """The simulator: the controller's own tick on a simulated clock and hosts.

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
@click.option("--tick", is_flag=True, hidden=True, help="Accepted and ignored: the controller's tick is the only "
              "engine now.")
@JSON_OPTION
def run(config: Path, workload: Path, output: Path | None, verify: Path | None, interval: float | None,
        load: Path | None, stop_at: float | None, save: Path | None, tick: bool, as_json: bool) -> None:
    """Run a workload on a cluster config to the end (or --stop-at) by the controller's own tick and
    print the summary: makespan, wait time percentiles per queue, utilisation per resource. Exit 1 if
    --verify finds a difference.

    Example: xce sim run xce.yaml workload.yaml --output run.rec && xce sim run xce.yaml workload.yaml --verify run.rec
    """
    from xce_lite.sim.batch import run_batch

    if tick:
        click.echo("xce sim run: --tick is no longer needed (the controller's tick is the only engine); it will "
                   "go in a later release", err=True)
    sim_, config_hash = _setup(config, workload, interval)
    try:
        text, figures, ok, said = run_batch(sim_, config_hash, output=output, verify=verify, load=load,
                                            stop_at=stop_at, save=save)
    finally:
        sim_.close()
    if as_json:
        echo_json({**figures, "verify": None if verify is None else {"file": str(verify), "ok": ok, "report": said}})
    else:
        click.echo(text)
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
    try:
        status = shell.run(sys.stdin)
    finally:
        shell.sim.close()
    sys.exit(status)


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
