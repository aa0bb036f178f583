"""`xce wait`: block until jobs end, saying each end as it happens (as pueue's `wait` does).

A few jobs: one line per job as it ends (`Job <3> DONE: exit code 0`). Arrays and many jobs: a
progress line with the counts (DONE, EXIT, running, pending), rewritten in place on a terminal, a
line for each element (or job) that ends EXIT, and at the end a summary line per array (and one for
more than ONE_LINE_EACH jobs of their own). `-q` prints nothing and `--json` only the final document:
the exit code says it all (0 all DONE, 1 any EXIT, 124 --timeout ran out). The controller's long-poll
(GET /jobs/wait) returns when every job has ended or its timeout passes, so a short timeout is the beat
at which changes are seen.
Light: click and the standard library.
"""

from __future__ import annotations

import sys
import time
from typing import ClassVar

import click

from xce_lite.api.client import Client
from xce_lite.cli.base import JSON_OPTION, Seconds, client, echo_json
from xce_lite.cli.complete import complete_jobs
from xce_lite.cli.jobs import display, outcome

EXIT_TIMEOUT = 124
FINISHED = ("DONE", "EXIT")
ONE_LINE_EACH = 20  # more jobs than this (or any array): the progress line instead


def wait_for(api: Client, ids: list[str], timeout: float | None, on_reply=None, **query) -> dict:
    """Long-poll until every job ended or `timeout` passed. With `on_reply`, which sees each
    answer, the polls are short (a second; five for a thousand jobs and more) so that each change
    is seen soon after it happens. `query`: more of GET /jobs/wait's parameters (`brief`: the
    answers count the jobs per state, "states", and list only what `list` and `singles` ask)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    beat = 30.0 if on_reply is None else 1.0
    while True:
        left = beat if deadline is None else max(0.0, min(beat, deadline - time.monotonic()))
        reply = api.get("/jobs/wait", ids=",".join(ids), timeout=left, **query)
        if on_reply is not None:
            on_reply(reply)
            beat = 1.0 if _size(reply) < 1000 else 5.0
        if reply["finished"] or (deadline is not None and time.monotonic() >= deadline):
            return reply


def _size(reply: dict) -> int:
    return sum(reply["states"].values()) if "states" in reply else len(reply["jobs"])


def print_final(reply: dict) -> None:
    """Every job's end (or its state, if it has not ended): `xce quickstart`'s and `-l` style."""
    for job in reply["jobs"]:
        click.echo(_end_line(job) if job["state"] in FINISHED else f"Job <{display(job)}> still {job['state']}")


def _end_line(job: dict) -> str:
    return f"Job <{display(job)}> {job['state']}: {outcome(job)}"


class Progress:
    """What `xce wait` has said so far, and what a new reply adds to it. The replies are brief
    (`QUERY`): the counts per state and per array, and the records of the jobs that failed, and of
    the jobs of their own when there are at most ONE_LINE_EACH (each of whose ends gets a line).
    The records of 40,000 elements cost the controller 2.4 s per poll; their counts, ~0.1 s."""

    QUERY: ClassVar[dict] = {"brief": True, "list": "EXIT", "singles": ONE_LINE_EACH}

    def __init__(self, terminal: bool):
        self.terminal = terminal
        self.said: set[int] = set()
        self.line = ""  # the progress line now on the terminal, if any

    def update(self, reply: dict) -> None:
        own = _own(reply)
        each = sum(own.values()) <= ONE_LINE_EACH  # else only failures get a line of their own
        for job in reply["jobs"]:
            if job["state"] in FINISHED and job["id"] not in self.said:
                self.said.add(job["id"])
                if job["state"] == "EXIT" or (each and job.get("array_id") is None):
                    self._say(_end_line(job))
        if self.terminal and (not each or reply["arrays"]):
            self._progress(_counts_line(reply["states"]))

    def finish(self, reply: dict) -> None:
        self._progress("")
        for array_id, counts in sorted(reply["arrays"].items(), key=lambda item: int(item[0])):
            click.echo(f"Array <{array_id}>: {_counts_line(counts)}")
        own = _own(reply)
        if sum(own.values()) > ONE_LINE_EACH:
            click.echo(f"Jobs: {_counts_line(own)}")
        elif not reply["finished"]:
            for job in reply["jobs"]:
                if job["state"] not in FINISHED and job.get("array_id") is None:
                    click.echo(f"Job <{display(job)}> still {job['state']}")

    def _say(self, text: str) -> None:
        line = self.line
        self._progress("")
        click.echo(text)
        self._progress(line)

    def _progress(self, text: str) -> None:
        if not self.terminal or text == self.line:
            return
        sys.stdout.write("\r\033[K" + text)
        sys.stdout.flush()
        self.line = text


def _own(reply: dict) -> dict[str, int]:
    """State -> how many jobs of their own (not array elements) of a brief reply are in it."""
    own = dict(reply["states"])
    for counts in reply["arrays"].values():
        for state, n in counts.items():
            own[state] -= n
    return {state: n for state, n in own.items() if n}


def _counts_line(states: dict[str, int]) -> str:
    done, failed = states.get("DONE", 0), states.get("EXIT", 0)
    running = sum(states.get(s, 0) for s in ("DISP", "RUN", "USUSP", "SSUSP"))  # a queued successor shows PEND
    total = sum(states.values())
    return f"{done} DONE, {failed} EXIT, {running} running, {total - done - failed - running} pending (of {total})"


@click.command()
@click.argument("ids", nargs=-1, shell_complete=complete_jobs)
@click.option("--timeout", type=Seconds(min=0), help="Give up after this many seconds (exit 124).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing: the exit code says how they ended.")
@JSON_OPTION
@click.pass_context
def wait(ctx, ids, timeout, quiet, as_json) -> None:
    """Wait until the jobs end (an array: all its elements), saying each end as it happens; exit 0
    if all are DONE, 1 if any is EXIT, 124 if --timeout ran out. IDS: 42, or 42[7] for an element.

    Example: xce wait 42 43
    """
    if not ids:
        raise click.UsageError("name at least one job id")
    api = client(ctx)
    if quiet or as_json:
        reply = wait_for(api, list(ids), timeout, brief=not as_json)  # -q needs the counts alone
        if as_json:
            echo_json(reply)
    else:
        progress = Progress(sys.stdout.isatty())
        reply = wait_for(api, list(ids), timeout, on_reply=progress.update, **Progress.QUERY)
        progress.finish(reply)
    if not reply["finished"]:
        ctx.exit(EXIT_TIMEOUT)
    if "states" in reply:  # brief: the counts
        all_done = set(reply["states"]) <= {"DONE"}
    else:
        all_done = all(j["state"] == "DONE" for j in reply["jobs"])
    ctx.exit(0 if all_done else 1)
