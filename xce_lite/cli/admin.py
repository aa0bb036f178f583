"""`xceadmin`: the cluster administrator's commands. Thin, like cli/main.py.

`xceadmin check` reads xce.yaml and applications.yaml as the controller would, and the job store
read-only (beside a running controller or without one): schema errors with file, line and field,
an undefined default application, a queue removed while it has jobs; warnings for secret-looking
env names in profiles and selects that match no host; and, against the configuration the
controller last ran on (kept in the store), what a restart or `xce reconfig` would change for the
pending jobs, and what only a restart applies. Exit 0 with warnings, 2 with errors.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click

from xce_lite import errors
from xce_lite.cli.apps import review_lines
from xce_lite.cli.base import GROUP_SETTINGS, HOME_OPTION, Group
from xce_lite.home.paths import Home, resolve_home


class _AdminGroup(Group):
    prefix = "xceadmin"


@click.group(cls=_AdminGroup, context_settings=GROUP_SETTINGS)
@HOME_OPTION
@click.pass_context
def main(ctx: click.Context, home: str | None) -> None:
    """xceadmin: check and administer an xce_lite cluster home."""
    ctx.obj = resolve_home(home)


@main.command()
@click.pass_context
def check(ctx: click.Context) -> None:
    """Check the configuration files, and say what they would change for the pending jobs.

    Example: xceadmin check && xce reconfig
    """
    from xce_lite.config.checks import RUNNING_CONFIG_META, review
    from xce_lite.config.profiles import load_cluster
    from xce_lite.store.jobs import JobStore

    home: Home = ctx.obj.require()
    new = load_cluster(home.config)  # ConfigError: file, line, field
    jobs, running = [], None
    if home.store.exists():
        store = JobStore(home.store, readonly=True)
        try:
            jobs = store.unfinished()
            running = _running_config(store.meta(RUNNING_CONFIG_META))
        finally:
            store.close()
    result = review(new, jobs, running)
    for line in review_lines(result.to_json()):
        click.echo(line)
    if result.errors:
        raise errors.ConfigError("\n".join(result.errors))
    config, profiles = new
    against = "the running configuration" if running is not None else "no recorded configuration"
    click.echo(f"OK: {home.config} and its applications ({len(profiles)} profiles, {len(config.queues)} queues, "
               f"{len(config.hosts)} hosts); {len(result.warnings)} warning(s); {len(result.changes)} pending job(s) "
               f"would change (against {against}).")


def _running_config(text: str | None):
    """The configuration the controller last ran on, loaded from the store's copy; None if there
    is none or it no longer loads (then there is nothing to compare with)."""
    from xce_lite.config.profiles import load_cluster

    if not text:
        return None
    with tempfile.TemporaryDirectory(prefix="xceadmin-") as tmp:
        for name, content in json.loads(text).items():
            if content is not None:
                (Path(tmp) / name).write_text(content, encoding="utf-8")
        try:
            return load_cluster(Path(tmp) / "xce.yaml")
        except errors.ConfigError:
            return None


if __name__ == "__main__":  # pragma: no cover
    main()
