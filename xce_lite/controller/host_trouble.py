"""Hosts in trouble: a connected host whose last request failed takes no new work until it answers.

A part of the controller (`Controller.trouble`), given its dependencies: the clock, the log, and
`replan(wake)`, which tells the controller that what the scheduler may use has changed (and, when a
host is out of trouble, to tick at once). It owns the map host -> (why, since) alone; callers hold
the controller's lock. Invariants: a host is in it at most once, with the reason and time of the
FIRST failure in a row (later failures do not move it); entering and leaving are logged once each;
`reset` (the host connected again or went away) forgets it silently, since a new connection is judged
afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class HostTrouble:
    """See the module docstring."""

    def __init__(self, clock: Any, log: Callable[[str], None], replan: Callable[[bool], None]) -> None:
        self.clock, self.log, self.replan = clock, log, replan
        self._why: dict[str, tuple[str, float]] = {}  # host -> (why its last operation failed, since)

    def enter(self, name: str, why: str) -> None:
        """A request to connected host `name` failed: it takes no new work until it answers."""
        if name not in self._why:
            self.log(f"host {name} is in trouble: {why}; nothing new is placed there until it answers")
            self._why[name] = (why, self.clock.time())
            self.replan(False)

    def leave(self, name: str) -> None:
        """Host `name` answered: out of trouble, if it was in it."""
        if self._why.pop(name, None) is not None:
            self.log(f"host {name} answers again: out of trouble")
            self.replan(True)

    def reset(self, name: str) -> None:
        """Host `name` connected again or went away: its new connection is judged afresh."""
        self._why.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._why

    def __iter__(self) -> Iterator[str]:
        return iter(self._why)

    def __bool__(self) -> bool:
        return bool(self._why)

    def copy(self) -> dict[str, tuple[str, float]]:
        """host -> (why, since), as of now."""
        return dict(self._why)
