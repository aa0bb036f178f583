"""What the agent's one file loads and costs per interpreter: a unit's `exec` and the agent's `serve`.

    python bench/agent_imports.py [--runs 10] [--batch 20] [--against OTHER_TREE]

For this tree (and OTHER_TREE, alternating runs with it): the bundle (exec/bundle.py) is installed
in a temporary directory and compiled by one `serve` (its SPOOL/bin .pyc, the form units run). Then
`python3 -S -E -X importtime PYC exec NO_SUCH_DIR` (a unit's interpreter: it imports the supervisor's
modules, then exits 2) and `... serve --spool S --mode plain` with stdin at EOF (the serving agent's
imports, then EOF): the modules each loads (a deterministic count; the agent's own named), and each
one's CPU (user + system of the child, median of --batch runs, then the median of --runs such
batches). CPU, not wall time: the machine is shared. Prints the load. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent


def compiled(tree: Path, work: Path) -> tuple[Path, Path]:
    """(the bundle's compiled form, its spool): the tree's agent file installed in `work`, compiled by a serve."""
    code = "import sys; from xce_lite.exec.bundle import install; print(install(sys.argv[1]))"
    shipped = subprocess.run([sys.executable, "-c", code, str(work)], cwd=tree, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(tree)}, check=True).stdout.strip()
    spool = work / "spool"
    subprocess.run([sys.executable, "-S", "-E", shipped, "serve", "--spool", str(spool), "--mode", "plain"],
                   stdin=subprocess.DEVNULL, capture_output=True, cwd=work, check=True)
    [pyc] = [p for p in (spool / "bin").iterdir() if p.suffix == ".pyc"]
    return pyc, spool


def commands(pyc: Path, spool: Path, work: Path) -> dict[str, list[str]]:
    tail = [sys.executable, "-S", "-E", str(pyc)]
    return {"exec": [*tail, "exec", str(work / "no-such-unit")],
            "serve": [*tail, "serve", "--spool", str(spool), "--mode", "plain"]}


def modules(argv: list[str], cwd: Path) -> list[str]:
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, cwd=cwd)
    return [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and "self [us]" not in line]


def cpu_ms(argv: list[str], cwd: Path, batch: int) -> float:
    """Median CPU (ms) of `batch` runs of `argv`."""
    spent = []
    for _ in range(batch):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, cwd=cwd)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(1000 * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime))
    return statistics.median(spent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--against", type=Path, help="another checkout, measured alternately with this one")
    args = parser.parse_args(argv)
    trees = {"this": TREE, **({"other": args.against.resolve()} if args.against else {})}
    print(f"load before: {open('/proc/loadavg').read().strip()}")
    works = {name: Path(tempfile.mkdtemp(prefix="xb-imports-")) for name in trees}
    try:
        cmds = {name: commands(*compiled(tree, works[name]), works[name]) for name, tree in trees.items()}
        cpu: dict[tuple[str, str], list[float]] = {}
        for run in range(args.runs):
            order = list(trees) if run % 2 == 0 else list(reversed(trees))
            for name in order:
                for cmd, line in cmds[name].items():
                    cpu.setdefault((name, cmd), []).append(cpu_ms(line, works[name], args.batch))
        for cmd in ("exec", "serve"):
            loaded = {name: modules(cmds[name][cmd], works[name]) for name in trees}
            for name in trees:
                own = sorted(m.removeprefix("xce_agent.") for m in loaded[name] if m.startswith("xce_agent."))
                series = cpu[(name, cmd)]
                print(f"{cmd:5} {name} ({trees[name]}): {len(loaded[name])} modules, {len(own)} of the agent's; "
                      f"CPU per interpreter: median {statistics.median(series):.2f} ms, min {min(series):.2f}, "
                      f"max {max(series):.2f} ({args.runs} batches of {args.batch})\n      {' '.join(own)}")
            if len(trees) == 2:
                this, other = (set(loaded[name]) for name in ("this", "other"))
                print(f"      only this: {sorted(this - other)}; only other: {sorted(other - this)}")
    finally:
        for work in works.values():
            shutil.rmtree(work, ignore_errors=True)
    print(f"load after: {open('/proc/loadavg').read().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
