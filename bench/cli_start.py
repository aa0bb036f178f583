"""bench/run.py's section 4: one `xce submit` and one `xce --help` process against `python -c pass`
(ratios, interleaved), and the -X importtime top 10 beyond a bare start: what a user waits for
each time they type a command.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster, wait_idle
from report import Report, section
from stats import summary


def console_script() -> tuple[list[str], str]:
    beside = Path(sys.executable).parent / "xce"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)], f"console script {beside}"
    found = shutil.which("xce")
    if found:
        return [found], f"`xce` on PATH ({found}; may be a pyenv shim, which adds its own cost)"
    return [sys.executable, "-m", "xce_lite"], f"{sys.executable} -m xce_lite (no `xce` script found)"


def bench_cli(rep: Report, c: BenchCluster, samples: int) -> None:
    section(f"4. one `xce submit` / `xce --help` process vs `python -c pass`, {samples} samples each (interleaved)")
    script, how = console_script()
    print(f"    xce = {how}")
    cmds = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"],
        "xce submit -- true": [*script, "submit", "-o", c.out, "--", "true"],
        "xce --help": [*script, "--help"],
        "python -m xce_lite submit -- true": [sys.executable, "-m", "xce_lite", "submit", "-o", c.out, "--", "true"],
    }
    times: dict[str, list[float]] = {k: [] for k in cmds}
    failures: dict[str, str] = {}

    def once(name: str) -> float | None:
        t0 = time.perf_counter()
        r = subprocess.run(cmds[name], check=False, cwd=c.work, env=c.env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            failures.setdefault(name, f"exit {r.returncode}: {r.stderr.strip()[:300]}")
            return None
        return dt

    for name in cmds:  # warm the page cache
        once(name)
        once(name)
    for _ in range(samples):
        order = list(cmds)
        random.shuffle(order)
        for name in order:
            dt = once(name)
            if dt is not None:
                times[name].append(dt)
    for name, msg in failures.items():
        rep.note(f"{name}: FAILED", msg)
    base = summary(times["python -c pass"])["median"]
    rep.add("python -c pass (same interpreter)", "s", times["python -c pass"], peers="performance.md: 20.5 ms")
    rep.add("xce submit -- true (one process, wall)", "s", times["xce submit -- true"],
            peers="sbatch 8.3 ms, tsp 3.8 ms")
    rep.add("python -m xce_lite submit -- true", "s", times["python -m xce_lite submit -- true"])
    rep.add("xce --help (one process, wall)", "s", times["xce --help"], peers="bsub -h, sbatch --help")
    for name, key in (("xce submit -- true", "cli_submit"), ("xce --help", "cli_help")):
        if not times[name] or base <= 0:
            rep.why_not[key] = f"`{name}` failed: {failures.get(name, 'no samples')}"
            continue
        med_ratio = summary(times[name])["median"] / base
        rep.figures[key] = med_ratio
        rep.add(f"{name} / python -c pass (each sample / baseline median)", "x", [t / base for t in times[name]],
                goal="<= 4x (median / median)", met=med_ratio <= 4.0)
    bare = summary(times["python -I -S -c pass"])["median"]
    rep.add("python -I -S -c pass (no site, no .pth hooks: the bare floor)", "s", times["python -I -S -c pass"])
    rep.add("xce submit / python -I -S -c pass (information, no goal)", "x",
            [t / bare for t in times["xce submit -- true"]])
    wait_idle(c)

    # What the CLI path imports, once, beyond what a bare `python -c pass` imports (site, .pth hooks).
    def imported(*args: str) -> list[tuple[int, int, str]]:
        r = subprocess.run([sys.executable, "-X", "importtime", *args], check=False, cwd=c.work, env=c.env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        found = []
        for line in r.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            try:
                _, rest = line.split(":", 1)
                self_us, cum_us, name = (part for part in rest.split("|"))
                found.append((int(cum_us), int(self_us), name.rstrip()))
            except ValueError:
                continue
        return found

    floor = {name.strip() for _, _, name in imported("-c", "pass")}
    entries = sorted((e for e in imported("-m", "xce_lite", "--help") if e[2].strip() not in floor), reverse=True)
    print(f"\n    python -X importtime -m xce_lite --help: top 10 cumulative import costs beyond `python -c pass` "
          f"({len(entries)} modules more)")
    print(f"    {'cumulative':>10}  {'self':>8}  module (indent = nesting)")
    for cum, self_us, name in entries[:10]:
        print(f"    {cum / 1000:8.1f} ms  {self_us / 1000:6.1f} ms  {name}")
    heavy = [n.strip() for _, _, n in entries if n.strip().split(".")[0] in
             ("pydantic", "apsw", "fabric", "paramiko", "yaml", "psutil", "http", "multiprocessing")]
    print(f"    heavy modules on the CLI path: {', '.join(sorted(set(heavy))) or 'none'}")
