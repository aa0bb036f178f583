"""controller/accept.py and PendingSet.add_all: a submission checked once per distinct spec, and its
jobs fed to the pending set in one step, leave what one check and one `add` per job left."""

from __future__ import annotations

import pytest

from tests.support.inproc import InProc
from xce_lite import errors
from xce_lite.controller import accept
from xce_lite.controller.pending_set import PendingSet
from xce_lite.sched.core import PendingJob
from xce_lite.sched.placement import JobRequest


def _job(job_id: int, queue: str = "normal") -> PendingJob:
    return PendingJob(job_id, "alice", queue, JobRequest(job_id, 1, 2), 0, 1.0, "hash", project="lab")


def test_add_all_leaves_the_set_one_add_per_job_leaves_and_the_same_changes_for_the_scheduler():
    one, many = PendingSet(), PendingSet()
    for pending in (one, many):
        pending.add(_job(1))
        pending.add(_job(2))
        pending.take_changes(False)
        pending.discard(2)  # removed since the last session, then back: an add again
    jobs = [_job(2, "high"), _job(3), _job(4), _job(1, "high")]  # 1 is replaced, as add replaces it
    for job in jobs:
        one.add(job)
    many.add_all(jobs)
    assert list(one.values()) == list(many.values()) and len(one) == len(many) == 4
    assert one.take_changes(False) == many.take_changes(False)
    assert one.take_changes(True) == many.take_changes(True)


@pytest.fixture
def inproc():
    ip = InProc()
    yield ip
    ip.close()


def test_equal_specs_of_one_request_are_checked_once_and_share_one_item(inproc):
    spec = {"argv": ["true"], "cwd": str(inproc.work), "env": {"A": "1"}}
    checked = []
    real = inproc.ctl.submitting.validate

    def counting(raw, caller=None):
        checked.append(raw)
        return real(raw, caller)

    items = accept.specs([spec, dict(spec), dict(spec, env={"A": "2"}), dict(spec)], inproc.caller(), counting,
                         inproc.ctl.gating.resolve_depend)
    assert len(checked) == 2 and items[0] is items[1] is items[3] and items[2] is not items[0]
    assert items[2].spec.env == {"A": "2"}


def test_values_equal_in_python_but_of_other_types_are_checked_apart(inproc):
    """1 == True in Python, but a spec's checks may tell them apart: `hold: 1` is refused while
    `hold: true` is not, whatever came before it in the request."""
    spec = {"argv": ["true"], "cwd": str(inproc.work), "env": {}, "hold": True}
    with pytest.raises(errors.SpecError, match="^job 2: "):
        accept.specs([spec, dict(spec, hold=1)], inproc.caller(), inproc.ctl.submitting.validate,
                     inproc.ctl.gating.resolve_depend)
