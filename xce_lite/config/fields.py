"""The value types every configuration file shares: names, sizes, durations, and the strict model.

A size in a file is `512M`/`4G`, or a bare number of megabytes (as on the command line); a duration
is `90s`/`2h`, or a bare number of seconds. A bad value raises ValueError, which pydantic reports
with the field's place (config/yamlmodel.py adds the file and the line). Every model refuses
unknown keys and is frozen.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from xce_lite.errors import SpecError
from xce_lite.quantities import parse_duration, parse_size

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"  # a host, queue, pool, profile or resource name
WHO = r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$"  # a user or group name, as useradd allows


def size_value(value: Any) -> int:
    """A size in bytes, from the file's value."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512M or 4G")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("must be more than zero, e.g. 512M or 4G")
        return value * 1024**2  # a bare number is megabytes, as on the command line
    try:
        return parse_size(str(value))
    except SpecError as err:
        raise ValueError(str(err)) from None


def seconds_value(value: Any) -> float:
    """A duration in seconds, from the file's value."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)  # in the file a bare number is seconds: it reads as such next to its key
    try:
        return parse_duration(str(value))
    except SpecError as err:
        raise ValueError(str(err)) from None


Size = Annotated[int, BeforeValidator(size_value)]
Seconds = Annotated[float, BeforeValidator(seconds_value)]


class StrictModel(BaseModel):
    """A model of a config file's mapping: unknown keys refused, frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)
