"""Keeping each host connected: one link per host, (re)connecting in the background with backoff.

A connect may take seconds (an SSH handshake, copying the agent, a host that does not answer), so
it never runs on the controller's tick. A link owns its host's connection:

- it connects, lists the host's units, and only then announces `HostUp` (with the probe and the
  listed units), so the tick reconciles from values, without a round trip of its own;
- when the transport reports the channel lost, it announces `HostDown` at once, closes the old
  connection and tries again after a pause that doubles from `first_delay` up to `backoff_max`;
  a failed attempt is `HostDown` too (once per outage and reason: a new reason is news, so a host
  whose key changed while it was away says so at the next attempt, not "the agent's output ended"
  until a restart), with the error, which says what to check; a refused host key waits the longest
  pause (only a person can fix it, and nothing is accepted here; `retry_now` cuts it short);
- the units' own events (finished, launch replies) pass through to the controller's queue as they
  come, tagged with nothing: a result is a result whichever connection brought it.

Every announcement carries the link's generation (one per connection), so the controller never
mistakes a late word of an old connection for news of the current one. At most `MAX_CONNECTING`
links connect at once (sshd's MaxStartups refuses a crowd of handshakes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xce_lite import errors
from xce_lite.exec.host import Host, HostLost, HostProbe, UnitInfo

MAX_CONNECTING = 8
_connecting = threading.BoundedSemaphore(MAX_CONNECTING)


@dataclass(frozen=True)
class HostUp:
    """The host's agent answers; `units` is what it listed right after connecting."""

    host: str
    handle: Host
    probe: HostProbe
    units: tuple[UnitInfo, ...]
    generation: int


@dataclass(frozen=True)
class HostDown:
    """The host's agent is out of reach (lost, or a connect attempt failed); the link keeps trying."""

    host: str
    why: str
    generation: int


class _Forward:
    """The event sink a host is connected with: passes its events on, and catches its own loss."""

    def __init__(self, link: HostLink, generation: int):
        self.link, self.generation = link, generation

    def put(self, event: Any, block: bool = True, timeout: float | None = None) -> None:
        if isinstance(event, HostLost):
            self.link._lost(self.generation, event.why)
        else:
            self.link.events.put(event)


class HostLink:
    """Keeps one host connected. `factory()` makes a fresh, unconnected Host."""

    def __init__(self, name: str, factory: Callable[[], Host], events: Any, log: Callable[[str], None],
                 backoff_max: float = 60.0, first_delay: float = 1.0):
        self.name, self.factory, self.events, self.log = name, factory, events, log
        self.backoff_max, self.first_delay = backoff_max, first_delay
        self._cv = threading.Condition()
        self._generation = 0
        self._want_connect = True  # set when the current connection is lost (or at start)
        self._down_why: str | None = None  # the last HostDown's reason in the current outage
        self._closing = False
        self._current: Host | None = None
        self._thread = threading.Thread(target=self._run, name=f"link-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def retry_now(self) -> None:
        """Cut the current pause short (an admin asked, or the config changed)."""
        with self._cv:
            self._cv.notify_all()

    def close(self, timeout: float = 15.0) -> None:
        """Stop reconnecting and close the connection; running units go on on the host."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            current, self._current = self._current, None
        if current is not None:
            current.close()
        self._thread.join(timeout)

    # ---- the link's thread ------------------------------------------------------------------

    def _lost(self, generation: int, why: str) -> None:
        with self._cv:
            if generation != self._generation or self._closing:
                return  # an old connection's last word
            self._want_connect = True
            self._cv.notify_all()
        self._report_down(generation, why)

    def _report_down(self, generation: int, why: str) -> None:
        with self._cv:
            if self._down_why == why:
                return
            self._down_why = why
        self.events.put(HostDown(self.name, why, generation))

    def _run(self) -> None:
        delay = 0.0
        while True:
            with self._cv:
                while not self._closing and not self._want_connect:
                    self._cv.wait()
                if self._closing:
                    return
                if delay:
                    self._cv.wait(delay)  # retry_now() or close() cuts it short
                    if self._closing:
                        return
                old, self._current = self._current, None
                self._generation += 1
                generation = self._generation
            if old is not None:
                old.close()
            up = self._connect(generation)
            with self._cv:
                if isinstance(up, errors.HostKeyError):
                    delay = self.backoff_max  # only a person can fix the key: no quick retries
                    continue
                if up is None:
                    delay = min(self.backoff_max, max(self.first_delay, delay * 2))
                    continue
                if self._closing or generation != self._generation:
                    up.handle.close()
                    return
                self._current, self._want_connect, self._down_why = up.handle, False, None
                delay = 0.0
            self.events.put(up)

    def _connect(self, generation: int) -> HostUp | errors.HostKeyError | None:
        """The host up, or None (or the host key refusal) after reporting it down."""
        host = self.factory()
        try:
            with _connecting:
                probe = host.connect(_Forward(self, generation))
                units = tuple(host.list_units())
        except errors.HostKeyError as err:
            host.close()
            self._report_down(generation, str(err))
            return err
        except errors.ExecError as err:
            host.close()
            self._report_down(generation, str(err))
            return None
        except Exception as err:  # a bug or an unexpected library error: say so, keep trying
            host.close()
            self._report_down(generation, f"connecting failed unexpectedly: {err!r}")
            return None
        return HostUp(self.name, host, probe, units, generation)
