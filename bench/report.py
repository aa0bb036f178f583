"""The figures of a bench/run.py run: `Report` prints each as it is measured and a summary table
at the end; `goals` judges each goal of issue 18 on them (met / MISSED, or why this run cannot).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from stats import fmt, summary, table

KINDS = {"each": "one POST each", "batch": "one batch POST", "array": "one array POST"}


class Report:
    """Collects figures; prints each as it is measured and a summary table at the end."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.figures: dict[str, float] = {}  # key -> median, for the goals (only figures with samples)
        self.why_not: dict[str, str] = {}  # key -> why the figure is missing
        self.rounds: dict[str, list[float]] = {}  # kind -> its rate / HQ's, each round against the HQ run after it

    def add(self, name: str, unit: str, samples: list[float], goal: str = "", met: bool | None = None,
            peers: str = "", p95: bool = False, key: str = "") -> dict:
        s = summary(samples)
        if key and samples:
            self.figures[key] = s["median"]
        row = {"name": name, "unit": unit, "peers": peers, "goal": goal, "met": met, "show_p95": p95, **s}
        self.rows.append(row)
        extra = f", p95 {fmt(s['p95'], unit)}" if p95 else ""
        verdict = "" if met is None else ("  [goal met]" if met else "  [goal MISSED]")
        goal_text = f"  goal {goal}" if goal else ""
        print(f"  {name}: median {fmt(s['median'], unit)} (min {fmt(s['min'], unit)}, max "
              f"{fmt(s['max'], unit)}{extra}; {s['runs']} runs){goal_text}{verdict}", flush=True)
        return row

    def note(self, name: str, text: str) -> None:
        self.rows.append({"name": name, "text": text})
        print(f"  {name}: {text}", flush=True)

    def print_table(self) -> None:
        rows = [("figure", "median", "min", "max", "runs", "goal", "verdict", "peers on this machine")]
        for r in self.rows:
            if "text" in r:
                rows.append((r["name"], r["text"], "", "", "", "", "", ""))
                continue
            median = fmt(r["median"], r["unit"])
            if r["show_p95"]:
                median += f" (p95 {fmt(r['p95'], r['unit'])})"
            verdict = "" if r["met"] is None else ("met" if r["met"] else "MISSED")
            rows.append((r["name"], median, fmt(r["min"], r["unit"]), fmt(r["max"], r["unit"]),
                         str(r["runs"]), r["goal"], verdict, r["peers"]))
        print(table(rows))


def section(title: str) -> None:
    print(f"\n== {title} ({time.strftime('%H:%M:%S')})", flush=True)


def _ratio(rep: Report, top: str, bottom: str) -> float | None:
    a, b = rep.figures.get(top), rep.figures.get(bottom)
    return a / b if a is not None and b else None


def remote_goals(rep: Report, ran: bool = True) -> list[tuple[str, str, str]]:
    """The two goals over SSH (bench/remote.py, run.py's section `remote`): each a ratio of two
    figures measured interleaved in the same run, with the same jobs and slots in total."""
    f = rep.figures
    missing = rep.why_not.get("remote") or ("remote section not run" if not ran else "no successful run")
    rows = []
    for top, bottom, goal, need, what in (
            ("remote_plain", "remote_local", "over SSH: plain hosts >= 0.5x local throughput", 0.5, "jobs/s"),
            ("remote_systemd", "remote_floor",
             "over SSH: systemd hosts >= 0.8x a bare systemd-run loop on the same hosts", 0.8, "units/s")):
        value = _ratio(rep, top, bottom)
        if value is None:
            rows.append((goal, "-", f"not judged: {missing}"))
        else:
            rows.append((goal, f"{value:.2f}x ({f[top]:.0f} jobs/s vs {f[bottom]:.0f} {what})",
                         "met" if value >= need else "MISSED"))
    return rows


def goals(rep: Report, only: set[str], hq: bool) -> list[tuple[str, str, str]]:
    """(goal, figure of this run, met / MISSED / why it cannot be judged here) for each goal."""
    f = rep.figures
    no_hq = rep.why_not.get("hq") or ("--no-hq given" if not hq else "the floors section did not run")
    rows = []

    def judge(goal: str, value: float | None, text: str, ok, missing: str, scale: float = 1.0) -> None:
        if value is None:
            rows.append((goal, "-", f"not judged: {missing}"))
        else:
            rows.append((goal, text.format(value * scale), "met" if ok(value * scale) else "MISSED"))

    need_tput = "throughput section not run" if "throughput" not in only else "no successful run"
    for kind, hq_key, hq_name in (("each", "hq_jobs", "HQ's 1,000 one-task jobs"),
                                  ("array", "hq_array", "HQ's 1,000-task array")):
        what = "1,000 one-POST jobs" if kind == "each" else "1,000-element array"
        missing = need_tput if f"tput_{kind}" not in f else no_hq
        value = _ratio(rep, f"tput_{kind}", hq_key)
        text = "{:.2f}x" + (f" ({f[f'tput_{kind}']:.0f} vs {f[hq_key]:.0f} jobs/s)" if value is not None else "")
        judge(f"{what} >= 1.5x {hq_name}", value, text, lambda v: v >= 1.5, missing)
        pairs = rep.rounds.get(kind, [])
        if pairs:  # beside the goal's ratio of medians: how steady it is from round to round
            rows.append((f"(beside: {KINDS[kind]} / HQ, round by round: median; rounds at >= 1.5x)",
                         f"{statistics.median(pairs):.2f}x; {sum(p >= 1.5 for p in pairs)} of {len(pairs)}", ""))
    value = _ratio(rep, "tput_backlog", "tput_batch")
    judge("first 200 jobs with 10,000 pending >= 0.8x the empty queue (1,000-job batch POST)", value,
          "{:.2f}x" + (f" ({f['tput_backlog']:.0f} vs {f['tput_batch']:.0f} jobs/s)" if value else ""),
          lambda v: v >= 0.8, "needs the rss and throughput sections")
    judge("machine CPU per job <= 5 ms (1,000-job batch POST, /proc/stat as bench/cpu_per_job.py)",
          f.get("cpu_batch"), "{:.1f} ms", lambda v: v <= 5.0, need_tput)
    for key, what in (("cli_submit", "`xce submit -- true`"), ("cli_help", "`xce --help`")):
        judge(f"{what} <= 4x `python -c pass`", f.get(key), "{:.2f}x", lambda v: v <= 4.0,
              rep.why_not.get(key, "cli section not run"))
    judge("accepting a 1,000-element array <= 20 ms POST -> reply", f.get("accept_array"),
          "{:.1f} ms", lambda v: v <= 20.0, need_tput, scale=1000)
    rows.extend(remote_goals(rep, "remote" in only))
    judge("keep: submit -> start median <= 10 ms", f.get("latency"), "{:.1f} ms", lambda v: v <= 10.0,
          "latency section not run", scale=1000)
    judge("keep: controller RSS <= 60 MB at 10,000 pending", f.get("rss"), "{:.1f} MB",
          lambda v: v <= 60.0, "rss section not run")
    rows.append(("keep: decisions hashes unchanged; bench/scheduling.py no worse", "-",
                 "not judged here: tests/ and bench/scheduling.py"))
    if "tput_xargs" in f:
        for kind in ("each", "batch", "array"):
            if f"tput_{kind}" in f:
                rows.append((f"(beside: {KINDS[kind]} / xargs -P2, no goal)",
                             f"{f[f'tput_{kind}'] / f['tput_xargs']:.2f}x", ""))
    if f.get("hq_array") and f.get("cpu_array"):
        # every CPU busy all the time: the most machine CPU per job that 1.5x HQ's array rate leaves
        budget = 1000.0 * (os.cpu_count() or 1) / (1.5 * f["hq_array"])
        own = f" (HQ's own {f['hq_array_cpu']:.2f})" if f.get("hq_array_cpu") else ""
        rows.append(("(beside: machine CPU per job 1.5x HQ's array allows, every CPU busy / this run's array)",
                     f"{budget:.2f} ms / {f['cpu_array']:.2f} ms{own}", ""))
    if f.get("fsync") and f.get("hq_jobs"):
        ceiling = 1.0 / f["fsync"]  # one POST after another, each waits for at least this one sync
        rows.append(("(beside: one-POST ceiling at one fdatasync per POST and no CPU, / HQ one-task)",
                     f"{ceiling / f['hq_jobs']:.2f}x ({ceiling:.0f} jobs/s)", ""))
    return rows
