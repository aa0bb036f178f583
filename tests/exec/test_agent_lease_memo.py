"""A reused supervisor (pool.py) reads SPOOL/lease once for job after job while the file is the same
(its stamp unchanged), and again once it is replaced (a grant, which may shorten it) or once the
lease it read has run out (renewed meanwhile?). In-process, on Watch: what each job's
lease_lapsed() reads, and what it decides."""

from __future__ import annotations

import os

import pytest

from xce_lite.exec.agent import watch
from xce_lite.exec.agent.lease import clock, write_lease
from xce_lite.exec.agent.watch import Watch


class Recorder:
    boot = "this-boot"


@pytest.fixture
def reads(monkeypatch):
    """The spools read_lease was called for, in order (a fresh memo: as in a new worker)."""
    monkeypatch.setattr(watch, "_lease_read", ((), (0.0, 0.0)), raising=False)
    calls: list[str] = []
    real = watch.read_lease

    def counting(spool: str, boot: str):
        calls.append(spool)
        return real(spool, boot)

    monkeypatch.setattr(watch, "read_lease", counting)
    return calls


def next_job(spool: str) -> Watch:
    return Watch(Recorder(), {"unit": "u", "spool": spool, "role": "job"}, 1.0)


def test_jobs_in_sequence_read_an_unchanged_lease_once(tmp_path, reads):
    spool = str(tmp_path)
    write_lease(spool, Recorder.boot, clock() + 3600, clock(), 3600)
    for _ in range(3):
        w = next_job(spool)
        assert w.lease_lapsed() is None and w.lease_until is not None and w.lease_until > clock() + 3000
    assert reads == [spool]


def test_a_replaced_lease_is_read_again_and_a_shorter_one_that_ran_out_is_obeyed(tmp_path, reads):
    spool = str(tmp_path)
    write_lease(spool, Recorder.boot, clock() + 3600, clock(), 3600)
    assert next_job(spool).lease_lapsed() is None
    write_lease(spool, Recorder.boot, clock() - 1, clock() - 5, 4)  # a grant that ran out meanwhile
    assert next_job(spool).lease_lapsed().startswith("lease expired")
    assert reads == [spool, spool]


def test_a_lease_read_that_has_run_out_is_read_again(tmp_path, reads):
    spool = str(tmp_path)
    write_lease(spool, Recorder.boot, clock() + 0.2, clock(), 0.2)
    assert next_job(spool).lease_lapsed() is None
    stamp = os.stat(os.path.join(spool, "lease"))
    while clock() < watch._lease_read[1][0]:
        pass  # the lease read runs out; the file stays as it was
    assert os.stat(os.path.join(spool, "lease")).st_ino == stamp.st_ino
    assert next_job(spool).lease_lapsed().startswith("lease expired")
    assert reads == [spool, spool]
