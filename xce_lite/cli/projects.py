"""`xce projects [-l]`: the project tree, who may submit where, the limits and what running jobs hold
now (each project counts its whole subtree). Thin; light at import (click and the standard library).
"""

from __future__ import annotations

import click

from xce_lite.cli.base import JSON_OPTION, client, echo_json, echo_table
from xce_lite.quantities import format_size


@click.command()
@click.option("-l", "long", is_flag=True, help="Every project in full: members, groups, admins, limits, use.")
@JSON_OPTION
@click.pass_context
def projects(ctx, long, as_json) -> None:
    """List the projects as a tree: limits and current use (a project counts its subtree), jobs
    pending and running in each; `*` marks those you may submit to (`xce submit -P PATH`).

    Example: xce projects -l
    """
    reply = client(ctx).get("/projects")
    if as_json:
        echo_json(reply)
        return
    if reply["open"]:
        click.echo(f"No projects are defined: any project name is accepted (default: {reply['default']}).")
    if long:
        for p in reply["projects"]:
            click.echo(_long(p))
    elif reply["projects"]:
        rows = [("PROJECT", "LIMITS", "IN USE", "PEND", "RUN", "MEMBERS")]
        for p in reply["projects"]:
            depth = p["name"].count("/")
            rows.append((("* " if p["yours"] else "  ") + "  " * depth + p["name"].rsplit("/", 1)[-1],
                         _amounts(p["limits"]) or "-", _amounts(p["use"], p["limits"]) or "-",
                         str(p["pend"] + p["held"]), str(p["run"]),
                         _people(p) or ("-" if p["defined"] else "(not defined)")))
        echo_table(rows)
    defaults = ", ".join(f"group {g}: {path}" for g, path in sorted(reply["group_defaults"].items()))
    if not reply["open"]:
        click.echo(f"Default project: {reply['default']}" + (f"; {defaults}" if defaults else ""))


def _amount(name: str, value: float) -> str:
    if name == "mem":
        return format_size(int(value))
    return f"{value:g}"


def _amounts(values: dict, only: dict | None = None) -> str:
    names = [n for n in values if only is None or n in only or n in ("slots", "jobs")]
    return ", ".join(f"{n} {_amount(n, values[n])}" for n in names if only is not None or values[n] is not None)


def _people(p: dict) -> str:
    return ", ".join(p["members"] + [f"@{g}" for g in p["groups"]])


def _long(p: dict) -> str:
    lines = [f"Project <{p['name']}>" + (f": {p['description']}" if p["description"] else "")
             + ("" if p["defined"] else " (not defined now: jobs were submitted to it)")]
    if p["defined"]:
        lines.append(f"  Members: {', '.join(p['members']) or '-'}   Groups: {', '.join(p['groups']) or '-'}   "
                     f"Admins: {', '.join(p['admins']) or '-'}")
        lines.append(f"  Limits (its subtree at once): {_amounts(p['limits']) or 'none'}")
    lines.append(f"  In use (its subtree): {_amounts(p['use'], p['limits']) or 'nothing'}")
    lines.append(f"  Jobs of its own: {p['pend']} pending, {p['held']} held, {p['run']} running"
                 + ("   (you may submit here)" if p["yours"] else ""))
    return "\n".join(lines) + "\n"
