"""The README's blocks, as a test reads them: every indented or fenced block is marked, just before
it, with an HTML comment saying what it is (GitHub does not show it):

    <!-- readme-test: run -->          commands to paste: run in a fresh home, every output checked
    <!-- readme-test: run e2e -->      the same, where root and namespaces are needed (tests/e2e)
    <!-- readme-test: run e2e-host --> commands for a host of the reader's: run against a test host
    <!-- readme-test: setup -->        the set-up commands: checked against .ci/run, not run here
    <!-- readme-test: completion -->   lines for a shell's rc file: each shell's script is generated
    <!-- readme-test: yaml KIND -->    a sample: cluster (xce.yaml), applications, flow PATH, or prometheus
    <!-- readme-test: served -->       a command that serves until stopped: run by tests/e2e/test_web.py
    <!-- readme-test: python -->       a Python example, and `output` what it prints: tests/e2e/test_pyapi.py

In a command block, a line `#   TEXT` after a command is a line that command prints (stdout and
stderr together, in order; `...` matches any text, `~/` is the home); `#   [exit N]` says it exits
N (a command without one must exit 0). Other comments are for the reader. A line ending in `\\` goes
on on the next line. The commands of a block run in ONE bash, one after the other, so `cd` holds.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import paths

MARKER = re.compile(r"<!-- readme-test: ([a-z0-9-]+)((?: [^ ]+)*) -->")
EXIT = re.compile(r"\[exit (\d+)\]")
KINDS = ("run", "setup", "completion", "yaml", "served", "python", "output")


@dataclass
class Command:
    text: str
    line: int  # in README.md, 1-based
    expect: list[str] = field(default_factory=list)
    exit: int = 0


@dataclass
class Block:
    kind: str
    options: list[str]
    lines: list[str]  # dedented
    line: int  # of its first line in README.md

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def commands(self) -> list[Command]:
        found: list[Command] = []
        pending = ""
        for offset, raw in enumerate(self.lines):
            stripped = raw.strip()
            if stripped.startswith("#   ") and found and not pending:
                said = stripped[4:]
                exit_code = EXIT.fullmatch(said)
                if exit_code:
                    found[-1].exit = int(exit_code[1])
                else:
                    found[-1].expect.append(said)
                continue
            if not stripped or (stripped.startswith("#") and not pending):
                continue
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            found.append(Command(pending + raw, self.line + offset))
            pending = ""
        return found


def blocks(text: str | None = None) -> list[Block]:
    """Every code block of the README with its marker; AssertionError for one without."""
    text = (paths.ROOT / "README.md").read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    found: list[Block] = []
    marker: tuple[str, list[str], int] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.fullmatch(line.strip())
        if m:
            marker = (m[1], m[2].split(), i + 1)
            i += 1
            continue
        start = i
        if line.startswith("```"):
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            i += 1
        elif line.startswith("    ") and (i == 0 or not lines[i - 1].strip() or MARKER.fullmatch(lines[i - 1].strip())):
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or (not lines[i].strip() and i + 1 < len(lines)
                                                                      and lines[i + 1].startswith("    "))):
                body.append(lines[i][4:])
                i += 1
        else:
            assert not line.strip() or marker is None, f"README.md line {marker[2]}: a marker with no block after it"
            i += 1
            continue
        assert marker is not None, f"README.md line {start + 1}: a block without a `<!-- readme-test: ... -->` marker"
        assert marker[0] in KINDS, f"README.md line {marker[2]}: unknown kind {marker[0]!r} (kinds: {KINDS})"
        found.append(Block(marker[0], marker[1], body, start + 1 + (1 if line.startswith("```") else 0)))
        marker = None
    return found


def pattern(expected: str, home: Path) -> re.Pattern:
    text = expected.replace("~/", f"{home}/")
    return re.compile(".*".join(re.escape(part) for part in text.split("...")))


def shims(bin_dir: Path) -> Path:
    """`xce` and `xceadmin` on PATH, as `pip install` would put them, for the tree under test."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, module in (("xce", "-m xce_lite"), ("xceadmin", "-c 'from xce_lite.cli.admin import main; main()'")):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} {module} \"$@\"\n")
        shim.chmod(0o755)
    return bin_dir


def environment(home: Path, bin_dir: Path) -> dict[str, str]:
    """A new user's environment: a fresh HOME, the shims first on PATH, nothing of xce's set."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("XCE_", "XDG_", "_XCE"))}
    path = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), keep.get("PATH", "/usr/bin:/bin")])
    return {**keep, "HOME": str(home), "PATH": path, "LC_ALL": "C.UTF-8"}


@dataclass
class Outcome:
    command: Command
    code: int
    output: str


def run(block: Block, home: Path, env: dict[str, str], prelude: list[str] = (), timeout: float = 600,
        rewrite=None, wrap: list[str] = ()) -> list[Outcome]:
    """Run the block's commands in one bash in `home`; each command's exit code and output.
    `rewrite(text)`: the command as it is to run (a host's address of the reader's made a test
    host's); `prelude`: commands run first, unchecked; `wrap`: argv the bash runs under (another
    user's credentials, a test host's namespaces)."""
    commands = block.commands()
    out = home / ".readme-test"
    out.mkdir(parents=True, exist_ok=True)
    script = ["cd \"$HOME\" || exit 99", *prelude]
    for n, command in enumerate(commands):
        text = rewrite(command.text) if rewrite else command.text
        script.append(f"{{ {text}\n}} >{out}/{n}.out 2>&1 </dev/null; echo $? >{out}/{n}.rc")
    result = subprocess.run([*wrap, "bash", "-c", "\n".join(script)], env=env, capture_output=True, text=True,
                            timeout=timeout, cwd=home)
    assert result.returncode == 0, f"the block's shell failed ({result.returncode}): {result.stderr}"
    outcomes = []
    for n, command in enumerate(commands):
        code = int((out / f"{n}.rc").read_text()) if (out / f"{n}.rc").exists() else -1
        text = (out / f"{n}.out").read_text(errors="replace") if (out / f"{n}.out").exists() else ""
        outcomes.append(Outcome(command, code, text))
    shutil.rmtree(out, ignore_errors=True)
    return outcomes


def problems(outcomes: list[Outcome], home: Path, rewrite=None) -> list[str]:
    """What differs from what the README says: each as README line, command, expected, got."""
    found = []
    for o in outcomes:
        c = o.command
        wrong = []
        if o.code != c.exit:
            wrong.append(f"exit {o.code}, the README says {c.exit}")
        lines = o.output.splitlines()
        at = 0
        for expected in c.expect:
            want = pattern(rewrite(expected) if rewrite else expected, home)
            while at < len(lines) and not want.fullmatch(lines[at].rstrip()):
                at += 1
            if at == len(lines):
                wrong.append(f"no line (after the ones matched before) matches `#   {expected}`")
                break
            at += 1
        if "Traceback (most recent call last)" in o.output or "internal error" in o.output:
            wrong.append("a traceback or an internal error")
        if wrong:
            found.append(f"README.md line {c.line}: {c.text}\n  " + "\n  ".join(wrong) + "\n  its output:\n"
                         + "\n".join(f"    | {line}" for line in lines[-40:]))
    return found


def stop_home(home_root: Path, env: dict[str, str]) -> None:
    """Stop what a block left running in a home: its lab, its controller, its jobs' supervisors."""
    from xce_lite.exec.local import supervisor_pids
    from xce_lite.testhosts.base import kill_tree

    if not (home_root / "xce.yaml").exists():
        return
    xce = [sys.executable, "-m", "xce_lite", "--home", str(home_root)]
    if (home_root / "lab.json").exists():
        subprocess.run([*xce, "lab", "down"], env=env, capture_output=True, timeout=120)
    subprocess.run([*xce, "controller", "stop"], env=env, capture_output=True, timeout=60)
    lock = home_root / "controller.lock"
    pid = lock.read_text().strip() if lock.exists() else ""
    if pid.isdigit() and Path(f"/proc/{pid}").exists():
        os.kill(int(pid), signal.SIGKILL)
    spool = home_root / "spool"
    for folder in spool.glob("*/") if spool.is_dir() else []:
        for sup in supervisor_pids(folder):
            kill_tree(sup)
