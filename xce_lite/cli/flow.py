"""`xce flow submit | status | rescue`: a pipeline of named steps in one YAML file (flow.py says
what the file holds). The client reads and checks the whole file, builds each step's job spec as
`xce submit` would (a copy of this environment, paths made absolute), and sends the steps in one
request; the controller checks them again and stores them all or none. A step runs, by default, in
the flow file's directory, and relative paths in it (cwd, outputs) are relative to that directory.
Once the file checks out, the directories the steps write their output files to are created (a
pipeline's log directory need not exist before its first step runs).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click

from xce_lite import errors
from xce_lite.cli.base import client, table_lines
from xce_lite.cli.jobs import when


@click.group()
def flow() -> None:
    """Workflows: a pipeline of named steps in one YAML file (see examples/pipeline/)."""


@flow.command("submit")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override one of the flow's vars.")
@click.option("--check", is_flag=True, help="Only check the file and print the steps in order; submit nothing.")
@click.pass_context
def flow_submit(ctx, file: Path, sets: tuple[str, ...], check: bool) -> None:
    """Check a flow file whole (unknown steps, cycles, bad values: every problem, with its line),
    then submit all its steps at once, or none.

    Example: xce flow submit pipeline.yaml --set sims=50
    """
    loaded = load_file(file, _sets(sets), _known_names(ctx.obj))
    body = submission(file, loaded, make_dirs=not check)  # builds every step's spec: --check checks them too
    if check:
        for step in loaded.steps:
            click.echo(f"{step.name}{step.array or ''}" + (f"  after {step.depend}" if step.depend else ""))
        return
    reply = client(ctx).submit(body, "/flows", on_retry=lambda note: click.echo(f"xce: {note}", err=True))
    jobs = ", ".join(f"{s['step']} <{s['id']}{'[]' if s['array'] else ''}>" for s in reply["steps"])
    click.echo(f"Flow <{reply['flow']}> is submitted: {jobs}.")


def submission(file: Path, loaded, make_dirs: bool = True) -> dict:
    """The POST /flows body for a checked flow file (the Python API sends the same); with
    `make_dirs`, once the directories its steps write their output to exist."""
    base = file.resolve().parent
    steps = [{"step": step.name, "spec": _spec(step, base)} for step in loaded.steps]
    for spec in (s["spec"] for s in steps if make_dirs):
        for path in (spec.get("stdout"), spec.get("stderr")):
            if path and "%" not in os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
    return {"name": loaded.name, "steps": steps}


def _known_names(home) -> tuple[list[str], list[str]] | None:
    """(queues, profiles) of the cluster home's configuration, to check the steps against, or None
    when it cannot be read (the controller checks again anyway, and says what is wrong with it)."""
    from xce_lite.config.profiles import load_cluster

    try:
        config, profiles = load_cluster(home.config)
    except errors.XceError:
        return None
    return [q.name for q in config.queues], sorted(profiles)


def option_check(base: Path, known: tuple[list[str], list[str]] | None):
    """check(option, value) for workflow.flow.load: `xce submit`'s own parsers on one option at a
    time (so that every bad option of a step is found, not only the first), -R parsed as the
    controller parses it, queues and profiles against the cluster's."""
    from xce_lite.cli.submit import build_spec
    from xce_lite.sched import resreq_parse

    def check(key: str, value) -> str | None:
        if key == "depend":
            return None  # the flow's own check: its names are steps
        if key == "queue" and known is not None and value not in known[0]:
            return f"unknown queue {value!r}; the queues are: {', '.join(known[0])} (see `xce queues`)"
        if key == "app" and known is not None and value and value not in known[1]:
            return f"unknown application profile {value!r}; the profiles are: {', '.join(known[1])} (`xce apps`)"
        if key == "resreq":
            for text in value:
                try:
                    resreq_parse.parse(text)
                except errors.SpecError as err:
                    return str(err)
        try:
            build_spec({"cwd": str(base), key: value}, ["true"])
        except click.BadParameter as err:
            return err.message
        return None

    return check


def load_file(path: Path, sets: dict[str, str], known: tuple[list[str], list[str]] | None = None):
    """The file's Flow; ConfigError listing every problem as `FILE: steps.x.after (line N): ...`.
    `known`: the cluster's (queues, profiles), when the steps are to be checked against them."""
    from xce_lite.config import yamlfile
    from xce_lite.config.yamlmodel import problem
    from xce_lite.workflow import flow as flows

    try:
        data, root = yamlfile.read(path, errors.SpecError)  # UTF-8, valid YAML, no key twice
    except OSError as err:
        raise errors.SpecError(f"cannot read {path}: {err.strerror}") from None
    try:
        return flows.load(data, sets, option_check(path.resolve().parent, known))
    except flows.FlowError as err:
        lines = [problem(path, root, loc, message) for loc, message in err.problems]
        lines.sort(key=lambda text: int(m[1]) if (m := re.search(r" \(line (\d+)\): ", text)) else 0)  # file order
        raise errors.SpecError("\n".join(lines) + "\nnothing was submitted; fix the file and submit it again") from None


def _sets(pairs: tuple[str, ...]) -> dict[str, str]:
    values = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--set")
        values[key] = value
    return values


def _spec(step, base: Path) -> dict:
    """The step's job spec, as `xce submit` builds one; relative paths start at the flow's directory."""
    from xce_lite.cli.submit import build_spec

    options = dict(step.options, name=step.name)
    options["cwd"] = os.path.join(base, options.get("cwd") or ".")
    spec = build_spec(options, list(step.command))
    if step.array:
        spec["array"] = step.array
    if step.depend:
        spec["depend"] = step.depend
    return spec


@flow.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: {schema: 1, flow: {...}}.")
@click.pass_context
def flow_status(ctx, name: str, as_json: bool) -> None:
    """Draw a flow's graph (your most recent flow of that name), each step with its state.

    Example: xce flow status pipeline
    """
    reply = client(ctx).get("/flows", name=name)
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    f = reply["flow"]
    rescue = f", a rescue of #{f['rescue_of']}" if f["rescue_of"] else ""
    click.echo(f"Flow <{f['name']}> #{f['id']}{rescue}, submitted {when(f['submit_time'])}")
    for line in table_lines([("STEP", "STATE", "JOB", "DETAIL"), *graph_rows(f["steps"])]):
        click.echo("  " + line)


def graph_rows(steps: list[dict]) -> list[tuple[str, ...]]:
    """One row per step, upstream first, indented by its depth in the graph (`└─ collect`); a step
    with several upstream steps names them."""
    depth: dict[str, int] = {}
    rows: list[tuple[str, ...]] = []
    for s in steps:
        depth[s["step"]] = 1 + max((depth.get(u, 0) for u in s["upstream"]), default=-1)
        tree = ("   " * (depth[s["step"]] - 1) + "└─ " if depth[s["step"]] else "") + s["step"]
        counts = ", ".join(f"{n} {state}" for state, n in sorted(s["states"].items()))
        detail = counts if s["array"] else (s.get("pend_reason") or "")
        if len(s["upstream"]) > 1:
            detail = f"after {', '.join(s['upstream'])}" + (f"; {detail}" if detail else "")
        rows.append((tree, s["state"], f"{s['id']}{s.get('indices') or '[]'}" if s["array"] else str(s["id"]), detail))
    return rows


@flow.command("rescue")
@click.argument("name")
@click.pass_context
def flow_rescue(ctx, name: str) -> None:
    """Submit again what did not finish DONE in a flow (an array step: only its elements that did
    not), once none of its jobs still runs; steps that ended DONE are kept.

    Example: xce flow rescue pipeline
    """
    reply = client(ctx).submit({"name": name}, "/flows/rescue",
                               on_retry=lambda note: click.echo(f"xce: {note}", err=True))
    jobs = ", ".join(f"{s['step']} <{s['id']}{'[]' if s['array'] else ''}>" for s in reply["steps"])
    kept = f"; kept (DONE): {', '.join(reply['kept'])}" if reply["kept"] else ""
    click.echo(f"Flow <{reply['flow']}> is rescued: {jobs}{kept}.")
