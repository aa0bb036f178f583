"""Round trips to hosts that must never hold up the tick: signals (kills, stops) and the probes of a
host in trouble, each host on a worker thread of its own.

A signal's reply may take the agent's whole request timeout (30 s) when the host's sshd or network
freezes; on the tick's thread that stalled every job, and the error it raised stopped the
controller. Here each (host, connection generation) has one worker that carries out its requests
in order and reports each outcome to the controller's event queue as a `SignalDone`; the tick
applies it. A failed request leaves the worker probing the host with a cheap `ping` until one is
answered (`HostAnswers`), a new request comes, or the connection is replaced (`retire`): so a host
in trouble clears by itself once it answers again.

Invariants: a worker only ever talks to the connection (handle) it was made for; nothing here
touches the controller's view, it only reports; the workers are daemon threads.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

from xce_lite import errors

PROBE_EVERY = 5.0  # seconds between two probes of a host whose last request failed
PROBE_TIMEOUT = 10.0  # how long one probe waits for its answer


@dataclass(frozen=True)
class SignalDone:
    """How a signal request ended: `found` the unit (delivered), or `error` (not delivered)."""

    host: str
    generation: int
    unit: str
    job_id: int | None  # the job whose kill it delivers; None for a stop
    found: bool
    error: str | None


@dataclass(frozen=True)
class HostAnswers:
    """A host whose last request failed answered a probe: it is out of trouble."""

    host: str
    generation: int


@dataclass(frozen=True)
class _Signal:
    unit: str
    name: str
    reason: str
    job_id: int | None


class _Worker:
    def __init__(self, name: str, generation: int, handle: Any, events: Any):
        self.name, self.generation, self.handle, self.events = name, generation, handle, events
        self.requests: queue.Queue[_Signal | None] = queue.Queue()
        self.retired = threading.Event()
        threading.Thread(target=self._run, name=f"hostops-{name}", daemon=True).start()

    def _run(self) -> None:
        troubled = False
        while True:
            try:
                item = self.requests.get(timeout=PROBE_EVERY if troubled else None)
            except queue.Empty:
                troubled = not self._probe()
                continue
            if item is None:
                return
            troubled = not self._signal(item)

    def _signal(self, item: _Signal) -> bool:
        if self.retired.is_set():  # the connection was replaced: its requests are sent again on the new one
            self.events.put(SignalDone(self.name, self.generation, item.unit, item.job_id, False,
                                       "the connection was replaced before the request was sent"))
            return True
        try:
            found, error = bool(self.handle.signal(item.unit, item.name, item.reason)), None
        except errors.ExecError as err:
            found, error = False, str(err)
        except Exception as err:  # a transport's bug must not end the worker: report it as the host's trouble
            found, error = False, f"unexpected error from the host's connection: {err!r}"
        self.events.put(SignalDone(self.name, self.generation, item.unit, item.job_id, found, error))
        return error is None

    def _probe(self) -> bool:
        try:
            self.handle.ping(PROBE_TIMEOUT)
        except errors.HostUnreachable:
            return False
        except Exception:  # as in _signal: the worker lives on; a probe is only a probe
            return False
        if not self.retired.is_set():
            self.events.put(HostAnswers(self.name, self.generation))
        return True


class HostOps:
    """The workers, one per (host, connection generation). Called from the tick's thread and the
    API's threads alike."""

    def __init__(self, events: Any):
        self._events = events
        self._workers: dict[str, _Worker] = {}
        self._lock = threading.Lock()

    def signal(self, name: str, generation: int, handle: Any, unit: str, signal: str, reason: str,
               job_id: int | None = None) -> None:
        """Queue `signal` for `unit` on host `name` over `handle`; the outcome comes as a SignalDone."""
        with self._lock:
            worker = self._workers.get(name)
            if worker is None or worker.generation != generation or worker.handle is not handle:
                if worker is not None:
                    worker.retired.set()
                    worker.requests.put(None)
                worker = self._workers[name] = _Worker(name, generation, handle, self._events)
        worker.requests.put(_Signal(unit, signal, reason, job_id))

    def retire(self, name: str) -> None:
        """The host's connection is gone or replaced: its worker stops after the request it is in."""
        with self._lock:
            worker = self._workers.pop(name, None)
        if worker is not None:
            worker.retired.set()
            worker.requests.put(None)

    def close(self) -> None:
        for name in list(self._workers):
            self.retire(name)
