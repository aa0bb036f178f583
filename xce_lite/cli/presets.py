"""`xce preset ...`: save, list, show, remove, export, import and pull presets, and report the jobs
submitted with one. Client-side (presets.py); only `pull`, `list --server`, `show --server` and
`report` talk to the controller. Light: click and the standard library.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

import click

from xce_lite import errors
from xce_lite.cli.base import JSON_OPTION, OUTPUT, client, echo_json, table_lines
from xce_lite.cli.complete import complete_presets
from xce_lite.cli.submit import build_spec, given_options, submit_options
from xce_lite.config import presets


def _echo_table(rows: Sequence[Sequence[str]]) -> None:
    for line in table_lines(rows):
        click.echo(line)


def as_command_line(preset: presets.Preset) -> str:
    """The preset as the submit options it stands for."""
    words = ["xce", "submit"]
    for key, value in preset.options.items():
        flag = presets.OPTIONS[key][0]
        if isinstance(value, bool):
            words += [flag] if value else []
        elif isinstance(value, list):
            for item in value:
                words += [flag, item]
        else:
            words += [flag, str(value)]
    return shlex.join(words + ["--", "CMD"])


def _server_presets(ctx: click.Context, name: str | None = None) -> tuple[dict, list[presets.Preset]]:
    """(the reply, its presets); the server adds each one's hash, which is not part of a document."""
    reply = client(ctx).get("/presets", name=name)
    found = [presets.from_json({k: v for k, v in doc.items() if k != "hash"}, f"the cluster's {doc.get('name')}")
             for doc in reply["presets"]]
    if name is not None:
        found = [p for p in found if p.name == name]  # an empty name is no filter to the server
    if name is not None and not found:
        raise errors.NotFound(f"the cluster has no preset {name!r}; `xce preset list --server` lists its presets")
    return reply, found


@click.group()
def preset() -> None:
    """Presets: your saved sets of submit options (`xce submit --preset NAME`)."""


@preset.command("save")
@click.argument("preset_name", metavar="NAME")  # not `name`: that is -J's
@submit_options
@click.option("--description", default="", help="What the preset is for.")
@click.option("--force", is_flag=True, help="Replace a preset of that name (keeping it as NAME.json.bak).")
@click.pass_context
def preset_save(ctx, preset_name, description, force, **options) -> None:
    """Save the submit options given here as preset NAME (in ~/.config/xce/presets).

    Example: xce preset save sweep -n 4,8 -R "rusage[mem=2G]" -W 30m --description "a parameter sweep"
    """
    given = given_options(ctx, options)
    if not given:
        raise click.UsageError("give the submit options to save, e.g. `xce preset save NAME -n 4 -W 30m`")
    saved = presets.Preset(presets.check_name(preset_name), given, description)
    build_spec(given, ["true"])  # the values must make a valid submit
    path = presets.save(saved, replace=force, backup=force)
    click.echo(f"Preset {preset_name} saved in {path} (hash {saved.hash}).")


@preset.command("list")
@click.option("--server", is_flag=True, help="The cluster's admin presets instead (for `xce preset pull`).")
@JSON_OPTION
@click.pass_context
def preset_list(ctx, server, as_json) -> None:
    """List your presets (or the cluster's, with --server).

    Example: xce preset list --server
    """
    if server:
        reply, found = _server_presets(ctx)
        problems = reply["problems"]
    else:
        found, problems = presets.list_dir()
    if as_json:
        echo_json({"schema": 1, "presets": [{**p.to_json(), "hash": p.hash} for p in found], "problems": problems})
        return
    for problem in problems:
        click.echo(f"xce: skipped: {problem}", err=True)
    if not found:
        click.echo("No preset found" + ("" if server else "; save one with `xce preset save NAME OPTIONS`"))
        return
    rows = [("PRESET", "HASH", "FROM", "DESCRIPTION")]
    rows += [(p.name, p.hash, f"{p.origin['cluster']}:{p.origin['name']}" if p.origin else "-", p.description)
             for p in found]
    _echo_table(rows)


@preset.command("show")
@click.argument("name", shell_complete=complete_presets)
@click.option("--server", is_flag=True, help="The cluster's admin preset of that name.")
@click.pass_context
def preset_show(ctx, name, server) -> None:
    """Show a preset: its options as a submit command line, and its file.

    Example: xce preset show sweep
    """
    if server:
        shown = _server_presets(ctx, name)[1][0]
    else:
        shown = presets.load(name)
    click.echo(f"Preset {shown.name} (hash {shown.hash})" + (f": {shown.description}" if shown.description else ""))
    click.echo(f"  {as_command_line(shown)}")
    click.echo(json.dumps(shown.to_json(), indent=2, ensure_ascii=False))


@preset.command("rm")
@click.argument("name", shell_complete=complete_presets)
def preset_rm(name) -> None:
    """Remove one of your presets.

    Example: xce preset rm sweep
    """
    presets.remove(name)
    click.echo(f"Preset {name} removed.")


@preset.command("export")
@click.argument("name", shell_complete=complete_presets)
@click.option("-o", "output", type=OUTPUT, help="Write here, not to stdout.")
def preset_export(name, output) -> None:
    """Write a preset as a JSON document others can import.

    Example: xce preset export sweep -o sweep.json
    """
    doc = presets.load(name).to_json()
    doc.pop("origin", None)  # where it was pulled from is this user's business, not the recipient's
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        Path(output).write_text(text, encoding="utf-8")
        click.echo(f"Preset {name} written to {output}.")


@preset.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--as", "new_name", metavar="NEW", help="Save it under this name instead.")
@click.option("--force", is_flag=True, help="Replace a preset of that name (keeping it as NAME.json.bak).")
def preset_import(file, new_name, force) -> None:
    """Save a preset document (from `xce preset export`) as one of your presets.

    Example: xce preset import sweep.json --as sweep2
    """
    try:
        raw = Path(file).read_bytes()
    except OSError as err:
        raise errors.SpecError(f"cannot read {file}: {err.strerror}") from None
    imported = presets.from_json(presets.parse_json(raw, file), file)
    imported = imported.renamed(new_name or imported.name)
    build_spec(imported.options, ["true"], imported, list(imported.options))
    path = presets.save(imported, replace=force, backup=force)
    click.echo(f"Preset {imported.name} saved in {path} (hash {imported.hash}).")


@preset.command("pull")
@click.argument("name")
@click.option("--as", "new_name", metavar="NEW", help="Save it under this name instead.")
@click.option("--force", is_flag=True, help="Replace a local preset of that name (keeping it as NAME.json.bak).")
@click.pass_context
def preset_pull(ctx, name, new_name, force) -> None:
    """Copy one of the cluster's admin presets into your presets. A local preset of the same name
    is refused, unless it was pulled from this same server preset (then it is updated).

    Example: xce preset pull gpu-train --as my-train
    """
    reply, (server,) = _server_presets(ctx, name)
    target = new_name or name
    try:
        local = presets.load(target)
    except errors.NotFound:
        local = None
    origin, backup = presets.pull_target(server, reply["cluster"], local, force)
    path = presets.save(server.renamed(target, origin), replace=local is not None, backup=backup)
    kept = f"; the old one is kept as {path.name}.bak" if backup else ""
    click.echo(f"Preset {target} pulled from {reply['cluster']}:{name} into {path} (hash {server.hash}){kept}.")


@preset.command("report")
@click.argument("name", shell_complete=complete_presets)
@click.option("-u", "user", help="This user's jobs; `all` for everyone's (default: yours).")
@JSON_OPTION
@click.pass_context
def preset_report(ctx, name, user, as_json) -> None:
    """List the jobs submitted with preset NAME (from their exdata), finished ones included.

    Example: xce preset report sweep
    """
    jobs = client(ctx).get("/jobs", all=True, user=user)["jobs"]
    try:
        current = presets.load(name).hash
    except errors.NotFound:
        current = None
    used_by = [(job, (job.get("meta") or {}).get("preset") or {}) for job in jobs]
    used_by = [(job, used) for job, used in used_by if used.get("name") == name]
    if as_json:
        echo_json({"schema": 1, "preset": name, "current_hash": current, "jobs": [
            {"id": job["id"], "state": job["state"], "hash": used.get("hash"), "submit_time": job["submit_time"],
             "name": job["name"]} for job, used in used_by]})
        return
    rows = [("JOBID", "STAT", "PRESET_HASH", "SUBMIT_TIME", "JOB_NAME")]
    for job, used in used_by:
        version = used.get("hash", "?") + (" (current)" if used.get("hash") == current else "")
        rows.append((str(job["id"]), job["state"], version,
                     time.strftime("%b %d %H:%M:%S", time.localtime(job["submit_time"])), job["name"]))
    if len(rows) == 1:
        click.echo(f"No job was submitted with preset {name}")
        return
    _echo_table(rows)
