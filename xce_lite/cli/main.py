"""`xce`: the command line. Thin: each command parses, calls the controller (or one library
function), prints. The commands live in modules by subject (setup, hosts, waiting, jobs, flow,
presets, apps, and the simulator's sim/cli.py); this one holds the group, submit and the commands
that act on jobs by id. Errors print in one style (cli/base.py): the message first, then a usage hint.

Exit codes: 0 ok; 1 a job failed (`xce wait`) or an operation was refused; 2 bad input (nothing was
stored); 3 the controller is not running; 124 `xce wait --timeout` ran out.
The submit path imports only light modules (no pydantic, no apsw, no fabric): one `xce submit` must
cost little more than starting Python.
"""

from __future__ import annotations

import sys
import time

import click

from xce_lite import __version__
from xce_lite.cli.acct import acct, hist
from xce_lite.cli.apps import apps, effective_lines, reconfig
from xce_lite.cli.base import GROUP_SETTINGS, HOME_OPTION, JSON_OPTION, Group, client, echo_json
from xce_lite.cli.complete import complete_jobs, complete_presets
from xce_lite.cli.flow import flow as flow_group
from xce_lite.cli.hosts import hosts, queues
from xce_lite.cli.jobs import jobs
from xce_lite.cli.presets import preset as preset_group
from xce_lite.cli.projects import projects
from xce_lite.cli.setup import controller, examples, init, lab, quickstart
from xce_lite.cli.submit import build_spec, expand, given_options, submit_options
from xce_lite.cli.web import metrics as metrics_command
from xce_lite.cli.web import web as web_command
from xce_lite.cli.waiting import wait
from xce_lite.config import presets
from xce_lite.home.paths import resolve_home
from xce_lite.sim.cli import sim as sim_group


@click.group(cls=Group, context_settings=GROUP_SETTINGS)
@HOME_OPTION
@click.version_option(__version__, "-V", "--version", prog_name="xce", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context, home: str | None) -> None:
    """xce_lite: an LSF-style batch engine. Start with `xce quickstart`."""
    ctx.obj = resolve_home(home)


# ---- jobs -----------------------------------------------------------------------------------------


@main.command(context_settings={"allow_interspersed_args": False})
@submit_options
@click.option("--preset", metavar="NAME", shell_complete=complete_presets,
              help="Start from a saved preset's options (`xce preset list`); options given here win.")
@click.option("--parsable", is_flag=True, help="Print only the job id.")
@click.argument("command", nargs=-1, required=True, metavar="-- CMD [ARGS]...")
@click.pass_context
def submit(ctx, preset, parsable, command, **options) -> None:
    """Submit CMD as a batch job. It runs as given, never through a shell: use `sh -c '...'` for one.

    The job gets a copy of this environment (as in LSF and Slurm) plus any --env, and its
    application profile's settings (-app; `xce apps -l` shows them).

    Example: xce submit -J sim -n 2,8 -R "rusage[mem=2G] span[ptile=4]" -W 30m -o out-%J.txt -- ./simulate
    """
    chosen = presets.load(preset) if preset is not None else None
    merged, from_preset = expand(given_options(ctx, options), chosen)
    spec = build_spec(merged, list(command), chosen, from_preset)
    # a reply lost after the request was sent: asked again once with the same request id, which
    # the controller answers with the job it stored, if it did, never a second one
    reply = client(ctx).submit({"jobs": [spec]}, on_retry=lambda note: click.echo(f"xce: {note}", err=True))
    job_id, queue_name, size = reply["ids"][0], reply["queues"][0], (reply.get("sizes") or [None])[0]
    array = f" (an array of {size} elements: {job_id}[index])" if size else ""
    click.echo(job_id if parsable else f"Job <{job_id}>{array} is submitted to queue <{queue_name}>.")


def _job_ids(values: tuple[str, ...]) -> list[str]:
    if not values:
        raise click.UsageError("name at least one job id")
    return list(values)


@main.command()
@click.option("-f", "follow", is_flag=True, help="Keep showing what the job writes until it ends.")
@click.option("-e", "errors_file", is_flag=True, help="Show the job's error file (-e) instead of its output.")
@click.argument("job_id", type=click.IntRange(min=1), shell_complete=complete_jobs)
@click.pass_context
def peek(ctx, follow, errors_file, job_id) -> None:
    """Show a job's output so far, read on its first host (LSF's bpeek); -f follows it.

    Example: xce peek -f 42
    """
    import base64

    api = client(ctx)
    offset = 0
    while True:
        reply = api.get("/jobs/peek", id=job_id, offset=offset, stream="err" if errors_file else "out")
        data = base64.b64decode(reply["data_b64"])
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        elif reply.get("message") and not follow:
            click.echo(reply["message"], err=True)
        offset = reply["offset"]
        if not follow or (reply["eof"] and reply["state"] in ("DONE", "EXIT")):
            return
        if reply["eof"]:
            time.sleep(0.5)


@main.command(context_settings={"allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, metavar="-- CMD [ARGS]...")
def launch(command) -> None:
    """From inside a job: run CMD once per task of the job, on every host it holds (LSF's blaunch),
    and exit with the worst exit code. Each copy sees XCE_TASK_INDEX and its host's XCE_HOST_NTASKS;
    its output goes to the job's output file on that host.

    Example: xce submit -n 8 -R "span[ptile=4]" -- xce launch -- ./worker
    """
    from xce_lite.exec.agent.launch import LaunchFailed, launch_tasks

    try:
        code = launch_tasks(list(command))
    except LaunchFailed as err:
        click.echo(f"xce launch: {err}", err=True)
        sys.exit(255)
    sys.exit(code if 0 <= code <= 255 else 255)


@main.command()
@click.argument("job_id", shell_complete=complete_jobs)
@JSON_OPTION
@click.pass_context
def why(ctx, job_id, as_json) -> None:
    """Say why a pending job waits: per host and per resource, tried against the cluster as it is now
    (or the dependency it waits for). JOB_ID: 42, or 42[7] for an array element.

    Example: xce why 42
    """
    reply = client(ctx).get("/jobs/why", id=job_id)
    if as_json:
        echo_json({"schema": 1, **reply})
        return
    click.echo(f"Job <{job_id}> {reply['state']}" + (f": {reply['summary']}" if reply.get("summary") else ""))
    for line in reply["lines"]:
        click.echo(f"  {line}")
    if reply.get("fairshare"):
        from xce_lite.cli.jobs import fair_share_line

        click.echo(f"  Fair share: {fair_share_line(reply['fairshare'])}")
    if reply.get("effective"):
        click.echo("  What it asks for [where from]:")
        for line in effective_lines(reply["effective"]):
            click.echo(line)


def _act(ctx, path: str, ids: tuple[str, ...], **extra) -> None:
    reply = client(ctx).post(path, {"ids": _job_ids(ids), **extra})
    failed = False
    for result in reply["results"]:
        click.echo(result["message"], err=not result["ok"])
        failed |= not result["ok"]
    if failed:
        ctx.exit(1)


# Commands that act on jobs by id, all alike: (name, API path, help with its example).
_ACTIONS = (
    ("kill", "/jobs/kill", "Kill jobs: pending ones end at once, running ones get TERM, then KILL after the "
                           "grace time."),
    ("hold", "/jobs/hold", "Hold pending jobs (PEND -> PSUSP) so the scheduler leaves them alone."),
    ("release", "/jobs/release", "Release held jobs (PSUSP -> PEND)."),
    ("suspend", "/jobs/suspend", "Suspend running jobs (RUN -> USUSP, LSF's bstop): their processes get SIGSTOP."),
    ("resume", "/jobs/resume", "Resume suspended jobs (USUSP -> RUN, LSF's bresume): their processes get "
                               "SIGCONT."),
)
_ACTION_IDS = "IDS: 42 (a job, or a whole array), 42[7] (one element of array 42)."


def _action_command(name: str, path: str, text: str) -> click.Command:
    @click.argument("ids", nargs=-1, shell_complete=complete_jobs)
    @click.pass_context
    def command(ctx, ids) -> None:
        _act(ctx, path, ids)

    command.__doc__ = f"{text} {_ACTION_IDS}\n\n    Example: xce {name} 42 43[7]\n    "
    return main.command(name)(command)


for _name, _path, _text in _ACTIONS:
    _action_command(_name, _path, _text)


@main.command()
@click.option("--hold", is_flag=True, help="Requeue it held (PSUSP): `xce release` lets it run again.")
@click.argument("ids", nargs=-1, shell_complete=complete_jobs)
@click.pass_context
def requeue(ctx, hold, ids) -> None:
    """Send dispatched or running jobs back to the queue (LSF's brequeue): their processes are
    stopped, and each job keeps its id and submit time and runs again as its next attempt.

    Example: xce requeue 42 --hold
    """
    _act(ctx, "/jobs/requeue", ids, hold=hold)


for _command in (init, quickstart, examples, controller, lab, jobs, wait, hosts, queues, projects, flow_group, apps,
                 reconfig, preset_group, sim_group, web_command, metrics_command, hist, acct):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
