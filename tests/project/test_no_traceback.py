"""No user mistake ever prints a traceback: every command of `xce` (and `xceadmin`), driven with bad
arguments generated from click's own parameter lists, against a real running controller.

For each command: an unknown option, an extra argument, its required arguments left out, and, one at
a time, each of its parameters given values that are wrong for its type (text that is no name, an
unclosed bracket, a number that is none or too big, a path that does not exist or is a directory,
a choice that is not one). Everything else is filled with a plausible value (BASE), so that the bad
value is what is tried. A run passes when it ends with an exit code and a message: no exception out
of the command, no "Traceback", no "internal error". The commands run in this process (click's
CliRunner calls the real `main`, which talks to the real controller over its socket); the
controller's log must hold no traceback either.

Commands that would start or stop real things when given good values (lab up, controller stop,
quickstart...) only ever get values click itself refuses, or ones refused before anything starts:
see SAFE_ONLY. `hosts add` always probes 127.0.0.1 on port 9 (nothing listens; test traffic stays on
loopback), unless the address or port is the value under test, which is then one refused before
anything resolves.
"""

from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.support import paths
from tests.support.cluster import Cluster
from xce_lite.cli import admin
from xce_lite.cli.main import main

FLOW = "name: fuzz\nvars: {n: '2'}\nsteps:\n  a: {command: [true], array: '1-${n}'}\n"
SIM = paths.EXAMPLES / "sim" / "ptile"

# Commands that must never run with good values: they would boot hosts, stop the controller, or
# start a second one. They get only bad values (see `_variants`) and click-level mistakes.
SAFE_ONLY = {("lab", "up"), ("lab", "down"), ("controller", "stop"), ("controller", "start"), ("quickstart",)}

# Values a bad value of the kind goes with, by parameter name (a file that exists, a valid id...)
BASE_ARGS: dict[str, str] = {
    "job_id": "1", "ids": "1", "name": "fuzz", "preset_name": "fuzz", "dest": "{tmp}/copy",
    "config": str(SIM / "xce.yaml"), "workload": str(SIM / "workload.yaml"), "out": "{tmp}/out.yaml",
    "command": "true", "n": "1",
}
ALWAYS = {("hosts", "add"): {"address": "127.0.0.1", "port": "9"}}
TEXT = ["", "bad name!", "a[1-10", "x" * 300, "-"]
PATHS = ["", "{tmp}/no/such/dir/file", "{tmp}", "{tmp}/a-file"]
NUMBERS = ["x", "-1", "99999999999999999999", "nan", "1e999"]
BAD_FOR = {  # values that are wrong in ways the parameter's type alone does not show
    "lab_dir": ["", "/tmp/xce-no-lab-here"],  # under /tmp: refused before anything boots
    "address": ["", "bad address!", "a[1-10"],  # refused before anything resolves
    "tasks": ["0", "4,2", "x", "1,"], "resreq": ["", "select[[[", "rusage[mem=lots]"],
    "depend": ["finished(3)", "done(", "numdone(1, >= 1)", "done(999999)"],
    "run_limit": ["forever", "-5m"], "mem_limit": ["lots", "-1G"], "retry_on": ["0", "x,1"],
    "env": ["NOEQUALS", "=x"], "app_param": ["NOEQUALS"], "sets": ["NOEQUALS", "nosuch=1"],
    "stdout": ["{tmp}", "/"], "stderr": ["{tmp}"], "cwd": ["{tmp}/no/such/dir"],
    "ids": ["x", "0", "1[", "1[0]", "99999999", "-3"], "job_id": ["x", "0", "1[2", "99999999"],
}


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group)  # the group is lazy (cli/main.py): ask it, do not read .commands
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        yield path + (name,), command
        if isinstance(command, click.Group):
            yield from _commands(command, path + (name,))


def _bad_values(param: click.Parameter) -> list[str]:
    if param.name in BAD_FOR:
        return BAD_FOR[param.name]
    kind = param.type
    if isinstance(kind, click.Choice):
        return ["bogus", ""]
    if isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        return NUMBERS
    if type(kind).__name__ in ("Path", "OutputPath"):
        return PATHS
    return TEXT


def _base(path: tuple[str, ...], command: click.Command, bad: click.Parameter | None = None,
          value: str = "") -> list[str]:
    """`xce PATH` with what it needs, and `bad` given `value` in its place."""
    options: list[str] = []
    for name, base in ALWAYS.get(path, {}).items():
        if bad is None or name != bad.name:
            options += [f"--{name}", base]
    if isinstance(bad, click.Option):
        options += [bad.opts[0], value]
    arguments = []
    for param in command.params:
        if not isinstance(param, click.Argument):
            continue
        if param is bad:
            arguments.append(value)
        elif param.required or param.nargs == -1:
            arguments.append(BASE_ARGS.get(param.name or "", "fuzz"))
    dashdash = ["--"] if command.context_settings.get("allow_interspersed_args") is False else []
    return [*path, *options, *dashdash, *arguments]


def _variants(path: tuple[str, ...], command: click.Command) -> Iterator[list[str]]:
    """Argument lists for `xce PATH ...`, each with one mistake."""
    yield [*path, "--no-such-option"]
    if isinstance(command, click.Group):
        yield [*path, "no-such-subcommand"]
        return
    if not any(isinstance(p, click.Argument) and p.nargs == -1 for p in command.params):
        yield [*_base(path, command), "extra-argument"]
    if any(isinstance(p, click.Argument) and p.required for p in command.params):
        yield [*path]
    for param in command.params:
        if param.name == "help" or getattr(param, "is_flag", False):
            continue
        if path in SAFE_ONLY and param.name != "lab_dir" and not isinstance(param.type, click.IntRange):
            continue
        for value in _bad_values(param):
            yield _base(path, command, param, value)


def _all_variants() -> list[list[str]]:
    found = [["--home", value, "jobs"] for value in ("", "{tmp}/no/such/home", "/" + "x" * 200)]
    found += [["--version", "extra"], ["no-such-command"]]
    for path, command in _commands(main):
        found.extend(_variants(path, command))
    return found


@pytest.fixture(scope="module")
def running():
    c = Cluster()
    tmp = Path(tempfile.mkdtemp(prefix="xce-fuzz-", dir=c.root))
    (tmp / "a-file").write_text("not what any command wants\n")
    (tmp / "flow.yaml").write_text(FLOW)
    env = {**c.env, "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "state")}
    try:
        c.start()
        assert c.xce("wait", str(c.submit("true"))).returncode == 0  # job 1: an id that exists
        yield c, tmp, env
    finally:
        c.close()


class Hung(Exception):
    """A command still running after HUNG_AFTER seconds: a bad value must not make it run forever."""


HUNG_AFTER = 60


def _hung(*_args) -> None:
    raise Hung(f"still running after {HUNG_AFTER} s")


def _invoke(cli: click.Command, args: list[str], tmp: Path, env: dict, cwd: Path) -> tuple[int | None, str, object]:
    args = [a.replace("{tmp}", str(tmp)) for a in args]
    runner = CliRunner()
    outer, began = signal.getitimer(signal.ITIMER_REAL)[0], time.monotonic()  # the suite's timeout: same timer
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(HUNG_AFTER)
    try:
        with runner.isolated_filesystem(temp_dir=cwd):
            result = runner.invoke(cli, args, env=env, input="", prog_name="xce", catch_exceptions=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # what is left of it, for the suite's timeout (pyproject.toml) to keep its word
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - began), 0.001))
    return result.exit_code, result.output, result.exception


def test_every_command_with_bad_arguments_says_what_is_wrong_and_never_shows_a_traceback(running):
    c, tmp, env = running
    failures = []
    variants = _all_variants()
    assert len(variants) > 400, len(variants)
    for args in variants + [["check", "--no-such-option"], ["check", "extra"]]:
        cli = admin.main if args[0] == "check" else main
        code, output, exception = _invoke(cli, args, tmp, env, c.root)
        trouble = exception is not None and not isinstance(exception, SystemExit)
        if trouble or any(w in output for w in ("Traceback", "internal error", "Hung")) or code is None:
            failures.append(f"xce {' '.join(args)!r} -> exit {code}: {exception!r}\n{output[-600:]}")
    assert not failures, f"{len(failures)} of {len(variants)} runs failed:\n\n" + "\n\n".join(failures[:15])
    assert "Traceback" not in (c.home / "controller.log").read_text()


def test_the_generator_reaches_every_parameter_of_every_command():
    variants = [" ".join(v) for v in _all_variants()]
    for path, command in _commands(main):
        for param in command.params:
            if param.name == "help" or getattr(param, "is_flag", False) or path in SAFE_ONLY:
                continue
            flag = param.opts[0] if isinstance(param, click.Option) else None
            assert any(v.startswith(" ".join(path)) and (flag is None or f" {flag} " in f" {v} ") for v in variants), \
                (path, param.name)
