"""Small statistics and formatting helpers for the benchmark (standard library only)."""

from __future__ import annotations

import math
import os
import statistics


def machine_busy_seconds() -> float:
    """The whole machine's busy CPU time so far: /proc/stat's user, nice, system, irq and softirq."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p95(xs: list[float]) -> float:
    """Nearest-rank 95th percentile (the value at rank ceil(0.95 n))."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def summary(xs: list[float]) -> dict:
    return {"median": median(xs), "min": min(xs) if xs else float("nan"),
            "max": max(xs) if xs else float("nan"), "p95": p95(xs), "runs": len(xs)}


def fmt(value: float, unit: str) -> str:
    """A number with its unit, scaled to something readable."""
    if math.isnan(value):
        return "n/a"
    if unit == "s":
        if value < 1e-3:
            return f"{value * 1e6:.0f} us"
        if value < 1:
            return f"{value * 1e3:.1f} ms"
        return f"{value:.2f} s"
    if unit == "MB":
        return f"{value:.1f} MB"
    if unit == "x":
        return f"{value:.2f}x"
    if unit in ("jobs/s", "submits/s", "tasks/s"):
        return f"{value:.0f} {unit}"
    return f"{value:g} {unit}"


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)
