"""`xce submit` itself, its options (shared with `xce preset save`), and the job spec they make.

On the submit path, so light: click and the standard library; what only some options need (presets,
arrays, dependencies, durations and sizes) is imported when they are given: `xce submit -- true`
loads none of it (tests/project/test_cli_imports.py). A preset expands here, on the client
(presets.py says how options and a preset combine); the spec then records the preset's name,
content hash and the spec fields it set in `exdata.meta.preset`, which the merge reads to label
those fields' origin `preset`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from xce_lite import errors
from xce_lite.cli.base import client
from xce_lite.cli.complete import complete_apps, complete_presets, complete_queues

if TYPE_CHECKING:
    from xce_lite.config.presets import Preset

# The option -> the spec field it sets (for the origins the merge reports)
SPEC_FIELD = {"tasks": "slots", "gpus": "resreq", "env_none": "env", "app_param": "app_params", "pre_exec": "hooks",
              "post_exec": "hooks"}
_BY_NAME = ("env", "app_param")  # NAME=VALUE lists: a preset's and the command line's merge by name

_OPTIONS = (
    click.option("-J", "name", help='Job name; "name[1-100:2,200]%10" submits an array (elements 1, 3, ... 99 '
                                    'and 200, at most 10 at once).'),
    click.option("-q", "queue", shell_complete=complete_queues, help="Queue (default: the cluster's default queue)."),
    click.option("-P", "project", metavar="PATH",
                 help="Project (lab/vision; LSF's bsub -P). Default: your group's default project, then the "
                      "cluster's (see `xce projects`)."),
    click.option("-app", "app", metavar="NAME", shell_complete=complete_apps,
                 help="Application profile (see `xce apps`); '' for none. Default: the cluster's default one."),
    click.option("-n", "tasks", metavar="MIN[,MAX]",
                 help="Tasks (slots): exactly MIN, or as many as fit from MIN to MAX (default: 1, or the profile's)."),
    click.option("-R", "resreq", multiple=True, metavar="REQ",
                 help='Resource requirements, LSF-style: "select[...] rusage[...] span[...] same[...] order[...]"'
                      " (repeatable: selects are ANDed, the rest merged)."),
    click.option("--gpus", type=click.IntRange(1, 1024), help="GPUs per host (the same as -R 'rusage[gpus=N/host]')."),
    click.option("-o", "stdout", help="Output file (%J: job id). Default: xce-%J.out in the working dir."),
    click.option("-e", "stderr", help="Error file (%J: job id). Default: into the output file."),
    click.option("--cwd", help="Working directory (default: here)."),
    click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
                 help="Set a variable in the job's environment (repeatable)."),
    click.option("--env-none", is_flag=True, help="Start from an empty environment instead of a copy of this one."),
    click.option("-W", "run_limit", help="Run limit: [hours:]minutes, or 30s, 10m, 2h."),
    click.option("-M", "mem_limit", help="Memory limit: 512M, 4G (a bare number is MB)."),
    click.option("-sp", "priority", type=click.IntRange(0, 100), default=0,
                 help="Job priority within its queue, 0-100: higher goes first (LSF's -sp)."),
    click.option("-H", "--hold", is_flag=True, help="Submit held (PSUSP); `xce release` lets it run."),
    click.option("--app-param", "app_param", multiple=True, metavar="NAME=VALUE",
                 help="A value for a param the application profile declares (repeatable; see `xce apps -l`)."),
    click.option("-w", "depend", metavar="EXPR",
                 help='Dependency: "done(42) && ended(prep) || exit(7, != 0)", numdone(ID, >= N), started(...); '
                      "Slurm's afterok:ID also works."),
    click.option("--on-dep-fail", "on_dep_fail", type=click.Choice(["cancel", "pend"]),
                 help="A dependency that can never be satisfied: cancel the job (default) or keep it pending."),
    click.option("--retry", "retry", type=click.IntRange(0, 100),
                 help="Requeue a failed attempt up to N times (XCE_ATTEMPT numbers the dispatches)."),
    click.option("--retry-on", "retry_on", metavar="CODES",
                 help="Retry only on these exit codes, e.g. 1,75 (default: any failure)."),
    click.option("-E", "pre_exec", metavar="CMD",
                 help="Pre-exec command (run by /bin/sh on the first host before the job; if it fails, the job "
                      "does not run and ends EXIT), inside the profile's pre_job_exec."),
    click.option("-Ep", "post_exec", metavar="CMD",
                 help="Post-exec command (run by /bin/sh on the first host after the job, however it ended), "
                      "inside the profile's post_job_exec."),
)


def submit_options(command):
    """The submit options, as decorators, in the order `--help` lists them."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


@functools.cache
def flags() -> dict[str, str]:
    """Each submit option's key -> its flag as --help shows it first (-J, -q, ...), read from the
    click options above: the same keys, in the same order, as presets.OPTIONS, without importing it."""
    return {param.name: param.opts[0] for param in click.command()(submit_options(lambda **_: None)).params}


@click.command(context_settings={"allow_interspersed_args": False})
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
    chosen = None
    if preset is not None:
        from xce_lite.config import presets

        chosen = presets.load(preset)
    merged, from_preset = expand(given_options(ctx, options), chosen)
    spec = build_spec(merged, list(command), chosen, from_preset)
    # a reply lost after the request was sent: asked again once with the same request id, which
    # the controller answers with the job it stored, if it did, never a second one
    reply = client(ctx).submit({"jobs": [spec]}, on_retry=lambda note: click.echo(f"xce: {note}", err=True))
    job_id, queue_name, size = reply["ids"][0], reply["queues"][0], (reply.get("sizes") or [None])[0]
    array = f" (an array of {size} elements: {job_id}[index])" if size else ""
    click.echo(job_id if parsable else f"Job <{job_id}>{array} is submitted to queue <{queue_name}>.")


def given_options(ctx: click.Context, options: dict[str, Any]) -> dict[str, Any]:
    """The options the user gave (not click's defaults), as JSON values (a preset's form)."""
    given = {}
    for key in flags():
        if ctx.get_parameter_source(key) not in (None, ParameterSource.DEFAULT):
            value = options[key]
            given[key] = list(value) if isinstance(value, tuple) else value
    return given


def expand(given: dict[str, Any], preset: Preset | None) -> tuple[dict[str, Any], list[str]]:
    """(the options to submit with, the options the preset supplied any of)."""
    if preset is None:
        return given, []
    merged, from_preset = dict(preset.options), set(preset.options)
    for key, value in given.items():
        if key in _BY_NAME and key in merged:
            pairs = {pair.partition("=")[0]: pair for pair in merged[key]}
            pairs.update((pair.partition("=")[0], pair) for pair in value)
            merged[key] = list(pairs.values())
        else:
            merged[key] = value
            from_preset.discard(key)
    return merged, sorted(from_preset)


def current_umask() -> int:
    """This process's umask, which the job gets (LSF's jobs run with their submitter's): from
    /proc, which reads it without setting it; else set and put back."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def build_spec(options: dict[str, Any], command: list[str], preset: Preset | None = None,
               from_preset: Sequence[str] = ()) -> dict[str, Any]:
    """The job spec the controller receives; click.BadParameter names the option (and the preset
    when the bad value came from it)."""

    def bad(key: str, message: str) -> click.BadParameter:
        where = f" (from preset {preset.name})" if preset is not None and key in from_preset else ""
        return click.BadParameter(message + where, param_hint=flags()[key])

    spec: dict[str, Any] = {"argv": list(command), "umask": current_umask()}
    name, array = None, None
    if options.get("name"):
        from xce_lite.workflow import arrays

        name, array = arrays.split_name(options["name"])
    if name is not None and ("[" in name or "]" in name):
        raise bad("name", f"{options['name']!r}: brackets make an array, name[1-10] or name[1-10]%5; close them, "
                          f"or leave them out of a plain job's name")
    for text in options.get("resreq", ()):
        if not str(text).strip():
            raise bad("resreq", "the requirement is empty; give one such as \"rusage[mem=2G]\", or leave -R out")
    if array is not None:
        try:
            spec["array"] = arrays.parse(array).text()
        except errors.SpecError as err:
            raise bad("name", str(err)) from None
    if options.get("depend") is not None:
        from xce_lite.workflow import deps

        try:
            deps.parse(options["depend"])
        except errors.SpecError as err:
            raise bad("depend", str(err)) from None
        spec["depend"] = options["depend"]
    for key in ("on_dep_fail", "retry"):
        if options.get(key) is not None:
            spec[key] = options[key]
    if options.get("retry_on") is not None:
        spec["retry_on"] = _codes(options["retry_on"], bad)
    if options.get("tasks") is not None:
        spec["slots"], spec["max_slots"] = _task_range(options["tasks"], bad)
    workdir = os.path.abspath(options.get("cwd") or os.getcwd())
    environment = {} if options.get("env_none") else dict(os.environ)
    environment.update(_pairs(options.get("env", ()), "env", bad))
    gpus = options.get("gpus")
    if options.get("project") is not None:
        spec["project"] = options["project"]
    spec.update(cwd=workdir, name=name or None, queue=options.get("queue"), app=options.get("app"),
                resreq=list(options.get("resreq", ())) + ([f"rusage[gpus={gpus}/host]"] if gpus else []),
                stdout=_absolute(options.get("stdout"), workdir), stderr=_absolute(options.get("stderr"), workdir),
                env=environment, hold=bool(options.get("hold")), priority=options.get("priority") or 0)
    if options.get("run_limit") is not None or options.get("mem_limit") is not None:
        from xce_lite.quantities import parse_duration, parse_size

        try:
            if options.get("run_limit") is not None:
                spec["run_limit"] = parse_duration(options["run_limit"], "run limit (-W)")
        except errors.SpecError as err:
            raise bad("run_limit", str(err)) from None
        try:
            if options.get("mem_limit") is not None:
                spec["mem_limit"] = parse_size(options["mem_limit"], "memory limit (-M)")
        except errors.SpecError as err:
            raise bad("mem_limit", str(err)) from None
    for key in ("stdout", "stderr"):
        if spec[key] is not None and "%" not in spec[key] and os.path.isdir(spec[key]):
            raise bad(key, f"{options[key]!r} is a directory; name a file in it, e.g. {options[key].rstrip('/')}/"
                           f"xce-%J.out")
    exdata: dict[str, Any] = {}
    params = _pairs(options.get("app_param", ()), "app_param", bad)
    if params:
        exdata["app_params"] = params
    hooks = {key: options[key] for key in ("pre_exec", "post_exec") if options.get(key)}
    if hooks:
        exdata["hooks"] = hooks
    if preset is not None:
        fields = sorted({SPEC_FIELD.get(key, key) for key in from_preset})
        exdata["meta"] = {"preset": {"name": preset.name, "hash": preset.hash, "fields": fields}}
    if exdata:
        spec["exdata"] = exdata
    return spec


def _pairs(values, key: str, bad) -> dict[str, str]:
    pairs = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name:
            raise bad(key, f"{value!r} is not NAME=VALUE")
        pairs[name] = rest
    return pairs


def _codes(text: str, bad) -> list[int]:
    try:
        codes = [int(part) for part in str(text).split(",")]
    except ValueError:
        raise bad("retry_on", f"{text!r} is not a list of exit codes such as 1,75") from None
    if not all(1 <= c <= 255 for c in codes):
        raise bad("retry_on", f"{text!r}: exit codes to retry on are from 1 to 255")
    return codes


def _task_range(text: str, bad) -> tuple[int, int]:
    low, sep, high = text.partition(",")
    try:
        low_n = int(low)
        high_n = int(high) if sep else low_n
    except ValueError:
        raise bad("tasks", f"{text!r} is not MIN or MIN,MAX (whole numbers, e.g. 4 or 2,8)") from None
    if low_n < 1 or high_n < low_n:
        raise bad("tasks", f"{text!r}: need 1 <= MIN <= MAX")
    return low_n, high_n


def _absolute(path: str | None, workdir: str) -> str | None:
    return None if path is None else os.path.join(workdir, path)
