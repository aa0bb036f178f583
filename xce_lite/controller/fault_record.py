"""The one kind of fault the controller does not go on after, and its record in the home.

A part of the controller (`Controller.fault_record`), given the home and the log. A fault that makes
going on unsafe (a corrupt store, a bug that left the in-memory view in an unknown state) is said in
the log and written to `controller.fault` in the home (daemon.py), which the next start reads
(`previous`, shown by `xce controller status` and in the log) until a clean stop clears it.
Invariants: `previous` is read once, at construction; writing the record is best effort (the disk
may be what failed) and never raises.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from xce_lite import errors
from xce_lite.controller.daemon import clear_fault, read_fault, write_fault
from xce_lite.home.paths import Home
from xce_lite.store.db import damaged


class FaultRecord:
    """See the module docstring."""

    def __init__(self, home: Home, log: Callable[[str], None]) -> None:
        self.home, self.log = home, log
        self.previous: dict | None = read_fault(home)  # why the previous run stopped on a fault

    def fatal(self, err: BaseException) -> None:
        """Going on is unsafe: say why in the log and in the home's fault file (best effort: the
        disk may be what failed), for `controller status` after the next start."""
        known = isinstance(err, errors.StoreError) or damaged(err)
        if known:
            what = str(err) if isinstance(err, errors.StoreError) else f"the job store is damaged ({err})"
            why = f"{what}; restore it from a backup (or move it away), then start the controller again"
        else:
            why = f"unexpected {err.__class__.__name__}: {err}"
        self.log(f"controller stopping: it is not safe to go on: {why}")
        if not known:  # a bug: where it happened is what its report needs
            for line in traceback.format_exception(err):
                for part in line.rstrip().splitlines():
                    self.log(f"  {part}")
        problem = write_fault(self.home, why)
        if problem is not None:
            self.log(problem)

    def clear(self) -> None:
        """A clean stop: the fault it started after is history."""
        clear_fault(self.home)
