"""A bounded pool of worker threads for the API server.

Invariants: never more than `size` threads, started only when work arrives and none is idle, and
kept (so that whatever a thread holds, such as the store's read connection, is reused, not
remade per request); work runs in arrival order; work that waited longer than the caller allows is
taken back with `expired`, so that the caller can answer it (503) instead of letting it wait on;
a thread may wait a moment for a next item of its own (`linger`: the server's kept-alive
connection) only while no item waits and fewer than half the threads do so.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class WorkerPool:
    def __init__(self, size: int, run: Callable[[Any], None], name: str = "api-worker",
                 start: Callable[[], object] | None = None):
        """`run(item)` on a worker thread for each item; `start()` first on each thread, once."""
        self.size = size
        self._run, self._start = run, start
        self._name = name
        self._cond = threading.Condition()
        self._items: deque[tuple[float, Any]] = deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for work and not yet woken for an item
        self._busy = 0
        self._lingering = 0  # threads between `linger` and `lingered`
        self._closed = False

    def submit(self, item: Any, now: float) -> None:
        """Queue `item` (its arrival time `now`, for `expired`); a thread takes it when one is free."""
        with self._cond:
            self._items.append((now, item))
            if self._idle:
                self._idle -= 1
                self._cond.notify()
            elif len(self._threads) < self.size:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads) + 1}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()

    def linger(self) -> bool:
        """Whether the calling thread, done with its item, may wait a moment for a next one of its
        own: not while work waits, nor beyond half the threads the pool may have, so that others'
        work still finds a thread. True takes a place: give it back with `lingered`."""
        with self._cond:
            if self._items or self._lingering >= self.size // 2:
                return False
            self._lingering += 1
            return True

    def lingered(self) -> None:
        with self._cond:
            self._lingering -= 1

    def expired(self, before: float) -> list[Any]:
        """Take back every queued item that arrived before `before` (oldest first)."""
        taken = []
        with self._cond:
            while self._items and self._items[0][0] < before:
                taken.append(self._items.popleft()[1])
        return taken

    def oldest(self) -> float | None:
        """When the item waiting longest arrived, or None if none waits."""
        with self._cond:
            return self._items[0][0] if self._items else None

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"threads": len(self._threads), "busy": self._busy, "queued": len(self._items),
                    "lingering": self._lingering}

    def close(self) -> list[Any]:
        """Stop taking work; the items still queued (the caller closes them). Running work finishes."""
        with self._cond:
            self._closed = True
            self._idle = 0
            left = [item for _, item in self._items]
            self._items.clear()
            self._cond.notify_all()
        return left

    def _work(self) -> None:
        if self._start is not None:
            self._start()
        while True:
            with self._cond:
                while not self._items:
                    if self._closed:
                        return
                    self._idle += 1
                    self._cond.wait()
                _, item = self._items.popleft()
                self._busy += 1
            try:
                self._run(item)
            finally:
                with self._cond:
                    self._busy -= 1
