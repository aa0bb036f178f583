"""Waiting for conditions in tests, never for fixed times."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, describe: str = "the condition", interval: float = 0.02
) -> T:
    """Call `predicate` until it returns something truthy, and return that.

    Raises AssertionError naming `describe` (and the last value seen) after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"gave up after {timeout:g} s waiting for {describe} (last value: {value!r})"
            )
        time.sleep(interval)
