"""Shell completion of the names a command takes: job ids, queues, hosts, profiles and presets.

click generates the shell scripts (`_XCE_COMPLETE=bash_source xce`; README "Shell completion")
and asks these functions for the candidates of an argument or option. During completion click
parses without running any group callback, so the home comes from the root's --home (or
XCE_HOME); the controller is asked with a short timeout. Invariant: completion never prints an
error and never fails: a controller that is down, slow or refusing gives no candidates.
Light: click and the standard library.
"""

from __future__ import annotations

from collections.abc import Callable

import click
from click.shell_completion import CompletionItem

from xce_lite.api.client import Client
from xce_lite.home.paths import resolve_home

TIMEOUT = 2.0


def _ask(ctx: click.Context, path: str, **query) -> dict:
    home = resolve_home(ctx.find_root().params.get("home"))
    api = Client(home.socket, timeout=TIMEOUT)
    try:
        return api.get(path, **query)
    finally:
        api.close()


def _completer(fetch: Callable[[click.Context], list[tuple[str, str]]]):
    """A shell_complete callback: (value, help) pairs from `fetch`, those starting with what was typed."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            found = fetch(ctx)
        except Exception:  # never in the way of a shell: no candidates instead
            return []
        return [CompletionItem(value, help=text or None) for value, text in found if value.startswith(incomplete)]

    return complete


def _jobs(ctx: click.Context) -> list[tuple[str, str]]:
    reply = _ask(ctx, "/jobs")
    found = [(str(j.get("display_id") or j["id"]), f"{j['state']} {j['name']}") for j in reply["jobs"]]
    found += [(str(a["id"]), f"array {a['name']}{a['indices']}") for a in reply["arrays"]]
    return sorted(found, key=lambda pair: (len(pair[0]), pair[0]))


def _queues(ctx: click.Context) -> list[tuple[str, str]]:
    return [(q["name"], q.get("description") or "") for q in _ask(ctx, "/queues")["queues"]]


def _hosts(ctx: click.Context) -> list[tuple[str, str]]:
    return [(h["name"], h["state"]) for h in _ask(ctx, "/hosts")["hosts"]]


def _apps(ctx: click.Context) -> list[tuple[str, str]]:
    return [(a["name"], a.get("description") or "") for a in _ask(ctx, "/apps")["apps"]]


def _presets(ctx: click.Context) -> list[tuple[str, str]]:
    from xce_lite.config import presets

    return [(p.name, p.description) for p in presets.list_dir()[0]]


complete_jobs = _completer(_jobs)
complete_queues = _completer(_queues)
complete_hosts = _completer(_hosts)
complete_apps = _completer(_apps)
complete_presets = _completer(_presets)
