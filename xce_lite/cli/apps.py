"""`xce apps` and `xce reconfig`, and how effective values and configuration reviews print (for
`xce jobs -l`, `xce why` and `xceadmin check`). Light: click and the standard library.
"""

from __future__ import annotations

import json

import click

from xce_lite.cli.base import client, table_lines


def effective_lines(rows: list[list[str]], indent: str = "    ") -> list[str]:
    """(field, value, origin) rows, aligned: `tasks  2..8  [profile]`."""
    if not rows:
        return []
    return [indent + line for line in table_lines([(f, v, f"[{o}]") for f, v, o in rows])]


def review_lines(review: dict) -> list[str]:
    """A configuration review (checks.Review.to_json) for people; errors come as a ConfigError."""
    lines = [f"warning: {w}" for w in review.get("warnings", ())]
    for change in review.get("changes", ()):
        what = f"would pend, refused now: {change['refused']}" if change["refused"] else ", ".join(change["fields"])
        lines.append(f"pending job {change['id']} changes: {what}")
    return lines


@click.command()
@click.option("-l", "long", is_flag=True, help="Every setting of each profile.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.pass_context
def apps(ctx: click.Context, long: bool, as_json: bool) -> None:
    """List the application profiles jobs can name with -app (applications.yaml).

    Example: xce apps -l
    """
    reply = client(ctx).get("/apps")
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    if long:
        for app in reply["apps"]:
            mark = "  (the default application)" if app["default"] else ""
            click.echo(f"APPLICATION {app['name']}{mark}  hash {app['hash']}")
            if app["description"]:
                click.echo(f"  {app['description']}")
            for line in table_lines([tuple(row) for row in app["fields"]]):
                click.echo(f"  {line}")
            click.echo("")
        return
    rows = [("APP_NAME", "DEFAULT", "KIND", "HASH", "DESCRIPTION")]
    rows += [(a["name"], "yes" if a["default"] else "", a["kind"], a["hash"], a["description"]) for a in reply["apps"]]
    for line in table_lines(rows):
        click.echo(line)


@click.command()
@click.option("--dry-run", is_flag=True, help="Only say what would change; apply nothing.")
@click.pass_context
def reconfig(ctx: click.Context, dry_run: bool) -> None:
    """Re-read xce.yaml and applications.yaml and apply them live: pending jobs see the new
    effective values, running jobs keep theirs. A configuration with errors changes nothing.

    Example: xce reconfig --dry-run && xce reconfig
    """
    reply = client(ctx).post("/controller/reconfig" + ("?dry_run=1" if dry_run else ""), {})
    for line in review_lines(reply):
        click.echo(line)
    changed = len(reply["changes"])
    click.echo(("Would change" if dry_run else "Reconfigured; changed") + f" the effective values of {changed} "
               f"pending job(s).")
