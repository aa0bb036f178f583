"""The host pools' Slurm commands (squeue, sbatch, scancel), off the tick: a worker thread per pool.

A Slurm command may take its whole deadline (30 s) when slurmctld is frozen, slow or gone; on the
tick's thread that stalled every job of the cluster, and a SIGTERM waited for it. Here the tick
(controller/pools.py) only hands over what it decided, after storing it (intent before act), and
takes the outcomes on a later tick from `results()`, as events: `Polled`, `Submitted`, `Cancelled`.

Invariants: a worker runs its pool's commands one at a time, in the order they were handed over
(so a poll asked after an sbatch sees what that sbatch did); it only reports, it never touches the
controller's view; `outstanding(pool, kind)` says what is handed over and not yet answered, so the
tick never piles up a second poll behind a frozen one. The workers are daemon threads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xce_lite.config.cluster import ClusterConfig, PoolConfig
from xce_lite.exec import slurm
from xce_lite.home.paths import Home


@dataclass(frozen=True)
class Polled:
    """An squeue's answer: the jobs (by id), or `error`. `began`: when it was asked (epoch)."""

    pool: str
    began: float
    jobs: dict[str, slurm.SlurmJob] | None
    error: str | None = None


@dataclass(frozen=True)
class Submitted:
    """An sbatch's answer: `job_id`, or `error`. `unsure`: it may have reached slurmctld all the
    same (it timed out after sending): only Slurm, asked later by the job's name, can say."""

    pool: str
    seq: int
    job_id: str | None
    error: str | None = None
    unsure: bool = False
    ended: float = 0.0


@dataclass(frozen=True)
class Cancelled:
    pool: str
    job_id: str
    error: str | None = None


@dataclass(frozen=True)
class _Request:
    kind: str  # "poll", "submit", "cancel"
    run: Callable[[], Any]  # the command itself (exec/slurm.py), on the worker's thread
    seq: int = 0
    job_id: str = ""


class SlurmWork:
    """The workers, one per pool, started on first use. `wake()` is called after each result (the
    controller's tick wakes up for it)."""

    def __init__(self, wake: Callable[[], None]):
        self._wake = wake
        self._lock = threading.Lock()
        self._queues: dict[str, queue.Queue[_Request | None]] = {}
        self._results: list[Polled | Submitted | Cancelled] = []
        self._outstanding: dict[tuple[str, str], int] = {}

    def poll(self, pool: str, run: Callable[[], dict[str, slurm.SlurmJob]]) -> None:
        self._put(pool, _Request("poll", run))

    def submit(self, pool: str, seq: int, run: Callable[[], str]) -> None:
        """`run()` is the sbatch (its job id); hand it over only once its intent is stored."""
        self._put(pool, _Request("submit", run, seq=seq))

    def cancel(self, pool: str, job_id: str, run: Callable[[], Any]) -> None:
        self._put(pool, _Request("cancel", run, job_id=job_id))

    def outstanding(self, pool: str, kind: str) -> int:
        with self._lock:
            return self._outstanding.get((pool, kind), 0)

    def busy(self) -> bool:
        with self._lock:
            return any(self._outstanding.values()) or bool(self._results)

    def results(self) -> list[Polled | Submitted | Cancelled]:
        """The outcomes since the last call, in the order they came."""
        with self._lock:
            out, self._results = self._results, []
        return out

    def close(self) -> None:
        with self._lock:
            queues = list(self._queues.values())
            self._queues.clear()
        for q in queues:
            q.put(None)

    def _put(self, pool: str, request: _Request) -> None:
        with self._lock:
            q = self._queues.get(pool)
            if q is None:
                q = self._queues[pool] = queue.Queue()
                threading.Thread(target=self._run, args=(pool, q), name=f"slurm-{pool}", daemon=True).start()
            key = (pool, request.kind)
            self._outstanding[key] = self._outstanding.get(key, 0) + 1
        q.put(request)

    def _run(self, pool: str, q: queue.Queue[_Request | None]) -> None:
        while (request := q.get()) is not None:
            result = _carry_out(pool, request)
            with self._lock:
                self._results.append(result)
                key = (pool, request.kind)
                self._outstanding[key] -= 1
            self._wake()


def _carry_out(pool: str, request: _Request) -> Polled | Submitted | Cancelled:
    began = time.time()
    try:
        value = request.run()
    except (slurm.SlurmError, OSError) as err:
        error = str(err)
    except Exception as err:  # a bug here must not end the worker: the pool shows it, the tick goes on
        error = f"unexpected error: {err!r}"
    else:
        if request.kind == "poll":
            return Polled(pool, began, value)
        if request.kind == "submit":
            return Submitted(pool, request.seq, value, ended=time.time())
        return Cancelled(pool, request.job_id)
    if request.kind == "poll":
        return Polled(pool, began, None, error)
    if request.kind == "submit":
        return Submitted(pool, request.seq, None, error, unsure=slurm.unsure(error), ended=time.time())
    return Cancelled(pool, request.job_id, error)


def slurm_via(config: ClusterConfig, home: Home, name: str) -> slurm.Runner | None:
    """Where pool `name`'s Slurm commands run: here (None), or its `via:` login host over SSH."""
    target = via_target(config, home, name)
    return slurm.over_ssh(target) if target is not None else None


def via_target(config: ClusterConfig, home: Home, name: str) -> Any:
    """The SshTarget of pool `name`'s `via:` login host; None for `via: local`."""
    from xce_lite.home.hostadd import ssh_target

    pool = pool_config(config, name)
    if pool is None or pool.via == "local":  # `local` is this machine, even beside a host named so
        return None
    host = next(h for h in config.hosts if h.name == pool.via)  # an ssh host: config checked it
    return ssh_target(host, config, home)


def pool_config(config: ClusterConfig, name: str) -> PoolConfig | None:
    return next((p for p in config.pools if p.name == name), None)


def pool_dir(home: Home, pool: PoolConfig) -> Path:
    """The pool's directory (its agent, the nodes' journals, Slurm's output), made if missing."""
    d = Path(pool.directory).expanduser() if pool.directory else home.root / "slurm" / pool.name
    d.mkdir(parents=True, exist_ok=True)
    return d
