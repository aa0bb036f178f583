"""The commands that act on jobs by id: peek, launch, why, kill, hold, release, suspend, resume,
requeue. Each parses, asks the controller, prints the answer; `xce` loads this module only when one
of them runs (cli/main.py's table). Light: click and the standard library.
"""

from __future__ import annotations

import sys
import time

import click

from xce_lite.cli.base import JSON_OPTION, client, echo_json
from xce_lite.cli.complete import complete_jobs


def _job_ids(values: tuple[str, ...]) -> list[str]:
    if not values:
        raise click.UsageError("name at least one job id")
    return list(values)


@click.command()
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


@click.command(context_settings={"allow_interspersed_args": False})
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


@click.command()
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
        from xce_lite.cli.apps import effective_lines

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
    return click.command(name)(command)


kill, hold, release, suspend, resume = (_action_command(*action) for action in _ACTIONS)


@click.command()
@click.option("--hold", is_flag=True, help="Requeue it held (PSUSP): `xce release` lets it run again.")
@click.argument("ids", nargs=-1, shell_complete=complete_jobs)
@click.pass_context
def requeue(ctx, hold, ids) -> None:
    """Send dispatched or running jobs back to the queue (LSF's brequeue): their processes are
    stopped, and each job keeps its id and submit time and runs again as its next attempt.

    Example: xce requeue 42 --hold
    """
    _act(ctx, "/jobs/requeue", ids, hold=hold)
