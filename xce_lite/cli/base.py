"""What every `xce` and `xceadmin` command shares: one error style, the home option, the client,
tables, JSON output and the output-path type. Light: click and the standard library only, and
`xce --help` imports this module: the client and json load only when a command uses them.

One error style: the message first (`xce: ...`), then, for a usage mistake, click's usage line and
its help hint. Our own errors (XceError) carry their exit code; click's usage errors exit 2; an
OSError the user's environment caused (a full disk, a file they may not write) is a message too,
exit 1. Anything else is a bug: `xce: internal error: ...` names it (XCE_DEBUG=1 shows the traceback).
Invariant: no user mistake ever prints a Python traceback.
"""

from __future__ import annotations

import codecs
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from xce_lite import errors

if TYPE_CHECKING:
    from xce_lite.api.client import Client

HOME_OPTION = click.option("--home", envvar="XCE_HOME", metavar="DIR",
                           help="The cluster home (default: $XCE_HOME, else ~/.xce if it holds a cluster, else "
                                "the machine's default home named in /etc/xce_lite/home, else ~/.xce).")
GROUP_SETTINGS = {"help_option_names": ["-h", "--help"]}
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="One JSON document (with a `schema` number).")


class Group(click.Group):
    """The top-level group: every error as `PREFIX: message`, then a usage hint where one helps."""

    prefix = "xce"

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except errors.XceError as err:
            click.echo(f"{self.prefix}: {err}", err=True)
            ctx.exit(err.exit_code)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        safe_output()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name or self.prefix, complete_var, False, **extra)
        except click.UsageError as err:
            self._usage_error(err)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"{self.prefix}: {err.format_message()}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo(f"{self.prefix}: aborted", err=True)
            sys.exit(1)
        except OSError as err:  # the environment, not a bug: say which file and why
            where = f"{err.filename}: " if err.filename else ""
            click.echo(f"{self.prefix}: {where}{err.strerror or err}", err=True)
            sys.exit(1)
        except Exception as err:
            if os.environ.get("XCE_DEBUG"):
                raise
            click.echo(f"{self.prefix}: internal error: {type(err).__name__}: {err} (a bug in xce_lite: please "
                       f"report it; XCE_DEBUG=1 shows where)", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def _usage_error(self, err: click.UsageError) -> None:
        """click's message first, then the usage line and where the help is."""
        click.echo(f"{self.prefix}: {err.format_message()}", err=True)
        ctx = err.ctx
        if ctx is not None:
            click.echo(ctx.get_usage(), err=True)
            if ctx.command.get_help_option(ctx) is not None:
                click.echo(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", err=True)


def _output_error(err: UnicodeError) -> tuple[str | bytes, int]:
    """Writing text the store holds: an undecodable byte of a job's argv or environment (carried as
    U+DC80..U+DCFF, Python's surrogateescape) is written back as that byte on a UTF-8 stream;
    anything else the stream cannot encode (a lone surrogate) as `\\uXXXX`. Never an exception."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    chunk = err.object[err.start:err.end]
    if err.encoding.lower().replace("-", "").replace("_", "") == "utf8" and all(
            0xDC80 <= ord(c) <= 0xDCFF for c in chunk):
        return bytes(ord(c) - 0xDC00 for c in chunk), err.end
    return codecs.backslashreplace_errors(err)


def safe_output() -> None:
    """Make stdout and stderr unable to fail on what they are given (observed: `xce jobs -l`
    crashed with UnicodeEncodeError on a job whose argument held a lone surrogate)."""
    codecs.register_error("xce.output", _output_error)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="xce.output")


def client(ctx: click.Context) -> Client:
    """A connection to the home's controller, closed when the command ends."""
    from xce_lite.api.client import Client

    api = Client(ctx.find_root().obj.require().socket)
    ctx.call_on_close(api.close)
    return api


def echo_json(doc: Any) -> None:
    import json

    text = json.dumps(doc, indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: as JSON's \uXXXX escapes, which decode back to it
        text = json.dumps(doc, indent=2, ensure_ascii=True)
    click.echo(text)


def table_lines(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def echo_table(rows: Sequence[Sequence[str]]) -> None:
    for line in table_lines(rows):
        click.echo(line)


class OutputPath(click.ParamType):
    """A file to write: its directory must exist and it must not be a directory itself, checked
    before anything runs (a simulation must not run for minutes and then fail to save)."""

    name = "file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        path = Path(value) if not isinstance(value, Path) else value
        if not str(value).strip():
            self.fail("the file name is empty", param, ctx)
        if path.is_dir():
            self.fail(f"{str(path)!r} is a directory; name a file in it", param, ctx)
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            self.fail(f"the directory {str(parent)!r} does not exist; create it first (mkdir -p {parent})", param, ctx)
        return path


OUTPUT = OutputPath()


class Seconds(click.FloatRange):
    """A number of seconds in a range: click's FloatRange lets `nan` through (every comparison with
    it is false), and a loop waiting nan seconds never ends."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and number != number:
            self.fail(f"{value!r} is not a number", param, ctx)
        return number
