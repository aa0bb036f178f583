"""Durations and sizes as users type them, and back. Pure; imported by the CLI, so kept light.

Durations: LSF's `[hours:]minutes` (`-W 90`, `-W 1:30`), or a number with a unit: `30s`, `10m`,
`2h`, `1d`. A bare number is minutes, as in LSF.
Sizes: `512M`, `4G`, `1.5T`, `100K`, `64b`; a bare number is megabytes, as in LSF (`-M 4000` is
4000 MB). Units are binary (1K = 1024).
"""

from __future__ import annotations

import math
import re

from xce_lite.errors import SpecError

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_UNITS = {"": 1024**2, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}

_UNIT_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$", re.IGNORECASE)
_LSF_DURATION = re.compile(r"^(?:(\d+):)?(\d+)$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([bkmgt]?)b?$", re.IGNORECASE)


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds from `[hours:]minutes` or `<number><s|m|h|d>`; SpecError names the value otherwise."""
    value = text.strip()
    match = _UNIT_DURATION.match(value)
    if match:
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    else:
        match = _LSF_DURATION.match(value)
        if not match:
            raise SpecError(
                f"{what} {text!r} is not a duration: use [hours:]minutes (90, 1:30) or a number "
                f"with a unit (30s, 10m, 2h, 1d)"
            )
        hours, minutes = int(match.group(1) or 0), int(match.group(2))
        seconds = float(hours * 3600 + minutes * 60)
    if not math.isfinite(seconds) or seconds > 100 * 365 * 86400:
        raise SpecError(f"{what} {text!r} is too large: at most 100 years")
    if seconds <= 0:
        raise SpecError(f"{what} {text!r} must be more than zero")
    return seconds


def parse_size(text: str, what: str = "size") -> int:
    """Bytes from `512M`, `4G`, `100K`, `2T`, `64b`; a bare number is megabytes, as in LSF."""
    match = _SIZE.match(text.strip())
    if not match:
        raise SpecError(f"{what} {text!r} is not a size: use a number with K, M, G or T (512M, 4G)")
    amount = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if not math.isfinite(amount) or amount >= 2**63:
        raise SpecError(f"{what} {text!r} is too large")
    size = int(amount)
    if size <= 0:
        raise SpecError(f"{what} {text!r} must be more than zero")
    return size


def format_duration(seconds: float) -> str:
    """`H:MM:SS`, hours unbounded: 3725 -> '1:02:05'. The form pend reasons and limits print."""
    total = int(round(seconds))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


def format_size(size: int) -> str:
    """The largest binary unit that keeps one decimal honest: 4294967296 -> '4G', 1536M -> '1.5G'."""
    for unit in ("T", "G", "M", "K"):
        scale = _SIZE_UNITS[unit.lower()]
        if size >= scale:
            value = size / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{size}B"
