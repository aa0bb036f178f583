"""The agent does not wake for a released worker's "i" (pool.Workers): the worker's socket leaves the
serve loop's poller at its release, and its "i" is read when a launch wants a worker, or
DRAIN_READ after the release if none does (then it is idle, and let go IDLE_FOR later). A launch
that finds none idle hands its job to a released one without waiting for its "i"; a signal for
that job waits for it (settle). The test plays the workers on real socket pairs; the poller is a
fake that keeps the fds registered."""

from __future__ import annotations

import os
import socket
import threading
import time

from xce_lite.exec.agent import pool
from xce_lite.exec.agent.pool import DRAIN_READ, IDLE_FOR, Workers


class Poller:
    def __init__(self):
        self.fds: set[int] = set()

    def register(self, fd: int, _events: int) -> None:
        self.fds.add(fd)

    def unregister(self, fd: int) -> None:
        self.fds.remove(fd)  # KeyError for an fd that was not registered, as select.poll's


def busy_worker(workers: Workers, pid: int) -> socket.socket:
    """A worker that runs a job and has said "d": the test's end of its socket."""
    ours, theirs = socket.socketpair()
    workers.add(pid, ours, b'{"unit": "u"}\n')
    theirs.recv(1 << 16)  # its job (the lock fd with it)
    theirs.sendall(b"d")
    workers.readable(ours.fileno(), time.monotonic())
    assert workers.ended == [pid]
    workers.ended.clear()
    return theirs


def test_a_released_worker_leaves_the_poller_and_its_idle_is_read_by_the_next_launch(tmp_path):
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    workers, poller = Workers(lock), Poller()
    workers.watch(poller)
    worker = busy_worker(workers, 101)
    fd = workers.socks[101].fileno()
    assert poller.fds == {fd}  # it runs a job: its "d" or EOF wakes the agent
    workers.release(101)
    assert worker.recv(1) == b"r" and poller.fds == set()  # its "i" wakes nobody
    worker.sendall(b"i")
    assert workers.take(b'{"unit": "v"}\n') == 101  # read here: idle, and given the job
    assert b'"v"' in worker.recv(1 << 16) and poller.fds == {fd}
    workers.forget_all()
    worker.close()
    os.close(lock)


def test_a_released_worker_no_launch_takes_is_read_after_drain_read_then_let_go_after_idle_for(tmp_path):
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    workers, poller = Workers(lock), Poller()
    workers.watch(poller)
    worker = busy_worker(workers, 102)
    workers.release(102)
    worker.recv(1)
    worker.sendall(b"i")
    now = time.monotonic()
    due = workers.expire(now)
    assert due is not None and 0 < due <= DRAIN_READ and workers.idle == []  # not read yet: no syscall
    later = now + DRAIN_READ + 0.01
    assert workers.expire(later) == IDLE_FOR and [pid for pid, _t in workers.idle] == [102]
    assert workers.expire(later + IDLE_FOR) is None and 102 not in workers.socks
    assert worker.recv(1) == b""  # let go: EOF, and it exits
    worker.close()
    os.close(lock)


def test_a_released_worker_that_died_is_forgotten_at_the_next_launch(tmp_path):
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    workers, poller = Workers(lock), Poller()
    workers.watch(poller)
    worker = busy_worker(workers, 103)
    workers.release(103)
    worker.close()  # it died before its "i"
    assert workers.take(b'{"unit": "w"}\n') is None  # none to be had: the caller forks one
    assert 103 not in workers.socks and not workers.draining and poller.fds == set()
    os.close(lock)


def test_a_launch_hands_its_job_to_a_released_worker_before_its_idle_and_its_signals_wait_for_it(tmp_path):
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    workers, poller = Workers(lock), Poller()
    workers.watch(poller)
    worker = busy_worker(workers, 104)
    workers.release(104)
    assert workers.take(b'{"unit": "x"}\n') == 104  # no "i" yet: handed all the same, no wait
    fd = workers.socks[104].fileno()
    assert workers.unsettled == {104} and not workers.draining and poller.fds == {fd}
    assert worker.recv(1) == b"r"  # the worker reads its release first, then its job
    answered = []

    def answer() -> None:  # the worker drops its stale signals, says "i", then reads the job
        time.sleep(0.2)
        answered.append(True)
        worker.sendall(b"i")

    thread = threading.Thread(target=answer)
    thread.start()
    assert workers.settle(104)  # what UnitState.deliver does before a signal to it
    thread.join()
    assert answered and workers.unsettled == set()
    assert b'"x"' in worker.recv(1 << 16)
    worker.sendall(b"d")  # job x ended; released; job y handed before the "i" again
    workers.readable(fd, time.monotonic())
    workers.ended.clear()
    workers.release(104)
    assert workers.take(b'{"unit": "y"}\n') == 104 and workers.unsettled == {104}
    worker.sendall(b"id")  # its "i", and job y's end with it: the "d" is left for the serve loop
    assert workers.settle(104)
    assert workers.unsettled == set() and workers.ended == [104] and 104 in workers.done
    workers.forget_all()
    worker.close()
    os.close(lock)


def test_a_worker_handed_its_job_early_that_never_says_idle_is_not_signalled(tmp_path, monkeypatch):
    """settle gives up after SEND_WAIT: UnitState.deliver then holds the signal until the job's
    `started` (which the worker writes only after it has dropped the stale ones)."""
    monkeypatch.setattr(pool, "SEND_WAIT", 0.1)
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    workers, poller = Workers(lock), Poller()
    workers.watch(poller)
    worker = busy_worker(workers, 105)
    workers.release(105)
    assert workers.take(b'{"unit": "z"}\n') == 105
    assert not workers.settle(105) and workers.unsettled == {105}  # stuck: no "i" within SEND_WAIT
    worker.sendall(b"i")
    assert workers.settle(105) and workers.unsettled == set()
    workers.forget_all()
    worker.close()
    os.close(lock)
