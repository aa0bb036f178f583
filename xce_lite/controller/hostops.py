"""Round trips to hosts that must never hold up the tick: signals (kills, stops), `xce launch`'s
tasks and answers, and the probes of a host in trouble, each host on a worker thread of its own.

A signal's reply may take the agent's whole request timeout (30 s) when the host's sshd or network
freezes; on the tick's thread that stalled every job, and the error it raised stopped the
controller. Here each (host, connection generation) has one worker that carries out its requests
in order and reports each outcome to the controller's event queue (a `SignalDone`, or a
`CallDone` for the other round trips); the tick applies it. A request the host did not answer
leaves the worker probing it with a cheap `ping` until one is answered (`HostAnswers`), a new
request comes, or the connection is replaced (`retire`): so a host in trouble clears by itself
once it answers again. A refusal (the host answered "no") is no trouble.

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
    trouble: bool = False  # the host did not answer (else it answered, perhaps with a refusal)


@dataclass(frozen=True)
class CallDone:
    """How another round trip ended: `error` None if it was answered; `about` is the caller's own."""

    host: str
    generation: int
    about: Any
    error: str | None
    trouble: bool = False  # as in SignalDone


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


@dataclass(frozen=True)
class _Call:
    fn: Any  # fn(handle): the round trip
    about: Any


class _Worker:
    def __init__(self, name: str, generation: int, handle: Any, events: Any):
        self.name, self.generation, self.handle, self.events = name, generation, handle, events
        self.requests: queue.Queue[_Signal | _Call | None] = queue.Queue()
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
            troubled = not (self._signal(item) if isinstance(item, _Signal) else self._call(item))

    def _signal(self, item: _Signal) -> bool:
        if self.retired.is_set():  # the connection was replaced: its requests are sent again on the new one
            self.events.put(SignalDone(self.name, self.generation, item.unit, item.job_id, False,
                                       "the connection was replaced before the request was sent"))
            return True
        found, error, trouble = _attempt(lambda: self.handle.signal(item.unit, item.name, item.reason))
        self.events.put(SignalDone(self.name, self.generation, item.unit, item.job_id, bool(found), error,
                                   trouble))
        return not trouble

    def _call(self, item: _Call) -> bool:
        error: str | None
        if self.retired.is_set():
            error, trouble = "the connection was replaced before the request was sent", False
        else:
            _result, error, trouble = _attempt(lambda: item.fn(self.handle))
        self.events.put(CallDone(self.name, self.generation, item.about, error, trouble))
        return not trouble

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
        self._worker(name, generation, handle).requests.put(_Signal(unit, signal, reason, job_id))

    def call(self, name: str, generation: int, handle: Any, fn: Any, about: Any) -> None:
        """Queue `fn(handle)` for host `name`; the outcome comes as a CallDone carrying `about`."""
        self._worker(name, generation, handle).requests.put(_Call(fn, about))

    def _worker(self, name: str, generation: int, handle: Any) -> _Worker:
        with self._lock:
            worker = self._workers.get(name)
            if worker is None or worker.generation != generation or worker.handle is not handle:
                if worker is not None:
                    worker.retired.set()
                    worker.requests.put(None)
                worker = self._workers[name] = _Worker(name, generation, handle, self._events)
            return worker

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


def _attempt(fn: Any) -> tuple[Any, str | None, bool]:
    """(fn()'s result, None, False); or (None, why it failed, whether the host did not answer)."""
    try:
        return fn(), None, False
    except errors.HostUnreachable as err:
        return None, str(err), True
    except errors.ExecError as err:  # the host answered, with a refusal
        return None, str(err), False
    except Exception as err:  # a transport's bug must not end the worker: count it as the host's trouble
        return None, f"unexpected error from the host's connection: {err!r}", True


class InlineHostOps:
    """HostOps without workers (tests, the simulator): each request is carried out at once on the
    caller's thread and its outcome put on the events queue, as a worker would report it."""

    def __init__(self, events: Any):
        self._events = events

    def signal(self, name: str, generation: int, handle: Any, unit: str, signal: str, reason: str,
               job_id: int | None = None) -> None:
        found, error, trouble = _attempt(lambda: handle.signal(unit, signal, reason))
        self._events.put(SignalDone(name, generation, unit, job_id, bool(found), error, trouble))

    def call(self, name: str, generation: int, handle: Any, fn: Any, about: Any) -> None:
        _result, error, trouble = _attempt(lambda: fn(handle))
        self._events.put(CallDone(name, generation, about, error, trouble))

    def retire(self, name: str) -> None:
        pass

    def close(self) -> None:
        pass
