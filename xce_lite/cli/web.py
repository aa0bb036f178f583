"""`xce web` (the dashboard) and `xce metrics` (Prometheus text, once).

Light on import: the web's libraries (uvicorn, Starlette, Jinja2) load inside `xce web` only, so
`xce submit` never pays for them.
"""

from __future__ import annotations

import click

from xce_lite import errors
from xce_lite.api import prometheus
from xce_lite.api.client import Client
from xce_lite.cli.base import Seconds


@click.command("web")
@click.option("--bind", default="127.0.0.1", show_default=True, metavar="ADDRESS",
              help="The address to listen on. Anything but localhost lets other machines in: read what it prints.")
@click.option("--port", type=click.IntRange(0, 65535), default=8090, show_default=True,
              help="The TCP port (0: any free one, printed at start).")
@click.option("--no-token", is_flag=True,
              help="Serve without the token in the link (only behind a proxy that checks who may see it).")
@click.option("--refresh", type=Seconds(1, 600), default=3.0, show_default=True,
              help="Seconds between a page's live updates.")
@click.pass_context
def web(ctx: click.Context, bind: str, port: int, no_token: bool, refresh: float) -> None:
    """Serve a read-only dashboard of this cluster (overview, jobs, hosts, flows, accounting) and
    /metrics, in its own process, reading the controller's API as you: it shows what `xce jobs
    -u all` shows you, and your jobs' output. Prints the link (with its token) and who can open it.

    Example: xce web --port 8090
    """
    from xce_lite.web.server import serve

    serve(ctx.obj.require(), bind, port, use_token=not no_token, refresh=refresh, say=click.echo)


@click.command("metrics")
@click.pass_context
def metrics(ctx: click.Context) -> None:
    """Print the cluster's metrics once, in Prometheus text format (as `xce web` serves at /metrics):
    jobs by state and queue, pending by reason kind, host resources, tick and session durations.
    Exit 3 if the controller is not running.

    Example: xce metrics | grep xce_jobs
    """
    client = Client(ctx.obj.require().socket)
    try:
        reply = client.get("/metrics")
    except errors.ControllerDown as err:
        click.echo(prometheus.render(None, str(err)), nl=False)
        raise
    finally:
        client.close()
    click.echo(prometheus.render(reply), nl=False)
