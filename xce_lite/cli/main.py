"""`xce`: the command line. Thin: each command parses, calls the controller (or one library
function), prints. The commands live in modules by subject (submit, actions, setup, hosts, waiting,
jobs, flow, presets, apps, and the simulator's sim/cli.py); this one holds only the group and the
table of commands. Errors print in one style (cli/base.py): the message first, then a usage hint.

Exit codes: 0 ok; 1 a job failed (`xce wait`) or an operation was refused; 2 bad input (nothing was
stored); 3 the controller is not running; 124 `xce wait --timeout` ran out.

Start-up cost is part of the interface: one `xce submit` must cost little more than starting Python
(issue 18: at most 4x `python -c pass`). So the group is lazy (click's documented LazyGroup
pattern): COMMANDS maps each name to the module that defines it, which is imported only when that
command runs (or its own --help is asked for). `xce --help` and completing a command name list the
table's summaries and import no command module. Invariant, checked by tests/project/test_cli_imports.py:
a table summary gives the same one-line help as the command's docstring, at every width.
"""

from __future__ import annotations

import importlib

import click

from xce_lite import __version__
from xce_lite.cli.base import GROUP_SETTINGS, HOME_OPTION, Group

# name -> (module, attribute, summary). The summary is the start of the command's docstring, long
# enough that click shortens it exactly as it would the docstring (the test above checks it).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "acct": ("xce_lite.cli.acct", "acct",
             "Usage of finished jobs (LSF's bacct, Slurm's sacct): jobs done and exited, wait time (median,"),
    "apps": ("xce_lite.cli.apps", "apps",
             "List the application profiles jobs can name with -app (applications.yaml)."),
    "controller": ("xce_lite.cli.setup", "controller",
                   "Start, stop or look at the controller of this cluster home."),
    "examples": ("xce_lite.cli.setup", "examples",
                 "The example scripts, flows, cluster configs and workloads shipped with xce_lite."),
    "flow": ("xce_lite.cli.flow", "flow",
             "Workflows: a pipeline of named steps in one YAML file (see examples/pipeline/)."),
    "hist": ("xce_lite.cli.acct", "hist",
             "Every event of jobs, in order, with the time spent in each state (LSF's bhist); finished jobs"),
    "hold": ("xce_lite.cli.actions", "hold",
             "Hold pending jobs (PEND -> PSUSP) so the scheduler leaves them alone."),
    "hosts": ("xce_lite.cli.hosts", "hosts",
              "List the hosts with their state and slots, or only those named (`xce hosts -l gpu1`); `xce"),
    "init": ("xce_lite.cli.setup", "init",
             "Create a cluster home with an xce.yaml for a one-host cluster on this machine."),
    "jobs": ("xce_lite.cli.jobs", "jobs",
             "List jobs, LSF-style (unfinished ones unless -a or ids are given); an array is one line (`42[1-20]`,"),
    "kill": ("xce_lite.cli.actions", "kill",
             "Kill jobs: pending ones end at once, running ones get TERM, then KILL after the grace time."),
    "lab": ("xce_lite.cli.setup", "lab",
            "A practice cluster: real SSH hosts on this machine, registered in this cluster home."),
    "launch": ("xce_lite.cli.actions", "launch",
               "From inside a job: run CMD once per task of the job, on every host it holds (LSF's blaunch),"),
    "metrics": ("xce_lite.cli.web", "metrics",
                "Print the cluster's metrics once, in Prometheus text format (as `xce web` serves at /metrics):"),
    "peek": ("xce_lite.cli.actions", "peek",
             "Show a job's output so far, read on its first host (LSF's bpeek); -f follows it."),
    "preset": ("xce_lite.cli.presets", "preset",
               "Presets: your saved sets of submit options (`xce submit --preset NAME`)."),
    "projects": ("xce_lite.cli.projects", "projects",
                 "List the projects as a tree: limits and current use (a project counts its subtree), jobs pending"),
    "queues": ("xce_lite.cli.hosts", "queues",
               "List the queues with their priority and jobs."),
    "quickstart": ("xce_lite.cli.setup", "quickstart",
                   "Create the home if needed, start the controller, run an example job and show its output."),
    "reconfig": ("xce_lite.cli.apps", "reconfig",
                 "Re-read xce.yaml and applications.yaml and apply them live: pending jobs see the new effective"),
    "release": ("xce_lite.cli.actions", "release",
                "Release held jobs (PSUSP -> PEND)."),
    "requeue": ("xce_lite.cli.actions", "requeue",
                "Send dispatched or running jobs back to the queue (LSF's brequeue): their processes are stopped,"),
    "resume": ("xce_lite.cli.actions", "resume",
               "Resume suspended jobs (USUSP -> RUN, LSF's bresume): their processes get SIGCONT."),
    "sim": ("xce_lite.sim.cli", "sim",
            "The simulator: the controller's own tick on a simulated clock and hosts."),
    "submit": ("xce_lite.cli.submit", "submit",
               "Submit CMD as a batch job."),
    "suspend": ("xce_lite.cli.actions", "suspend",
                "Suspend running jobs (RUN -> USUSP, LSF's bstop): their processes get SIGSTOP."),
    "wait": ("xce_lite.cli.waiting", "wait",
             "Wait until the jobs end (an array: all its elements), saying each end as it happens; exit 0"),
    "web": ("xce_lite.cli.web", "web",
            "Serve a read-only dashboard of this cluster (overview, jobs, hosts, flows, accounting) and"),
    "why": ("xce_lite.cli.actions", "why",
            "Say why a pending job waits: per host and per resource, tried against the cluster as it is"),
}


class LazyGroup(Group):
    """A group whose commands are imported when asked for by name (click's LazyGroup pattern);
    listing them (--help, completion of a command name) reads the table alone."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands or name not in self.lazy:
            return self.commands.get(name)
        module, attribute, _ = self.lazy[name]
        command = getattr(importlib.import_module(module), attribute)
        self.commands[name] = command  # loaded once per process (tests drive main many times)
        return command

    def _summary(self, name: str, limit: int) -> str:
        if name in self.commands:
            return self.commands[name].get_short_help_str(limit)
        from click.utils import make_default_short_help

        return make_default_short_help(self.lazy[name][2], limit)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        with formatter.section("Commands"):
            formatter.write_dl([(name, self._summary(name, limit)) for name in names])

    def shell_complete(self, ctx: click.Context, incomplete: str):
        from click.shell_completion import CompletionItem

        names = [name for name in self.list_commands(ctx) if name.startswith(incomplete)]
        # the options of the group itself, as click's own Group.shell_complete adds them
        return [CompletionItem(name, help=self._summary(name, 45)) for name in names] + \
            click.Command.shell_complete(self, ctx, incomplete)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings=GROUP_SETTINGS)
@HOME_OPTION
@click.version_option(__version__, "-V", "--version", prog_name="xce", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context, home: str | None) -> None:
    """xce_lite: an LSF-style batch engine. Start with `xce quickstart`."""
    from xce_lite.home.paths import resolve_home

    ctx.obj = resolve_home(home)


if __name__ == "__main__":  # pragma: no cover
    main()
