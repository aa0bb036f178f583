"""A pool's state is in the pend reasons of the jobs that may use it (pool_views.py words them), and
the scheduler answers only the reasons that changed: when a pool's state changes, the reasons of
its queues' jobs are answered again, and nothing else is (before, every reason, every session)."""

from __future__ import annotations

from tests.support.sched import host, job
from xce_lite.config.cluster import ClusterConfig
from xce_lite.controller.pool_views import AllocRecord, PoolRecords, PoolViews
from xce_lite.controller.pending_set import PendingSet
from xce_lite.controller.sched_worker import SchedulerProcess
from xce_lite.controller.seams import FakeClock
from xce_lite.controller.state import ControllerState
from xce_lite.sched.core import Snapshot
from xce_lite.sched.placement import HostView

CONFIG = {"cluster": "c", "hosts": [{"name": "login", "slots": 1, "mem": "1G"}],
          "queues": [{"name": "normal", "default": True}, {"name": "hpc", "hosts": ["hpc"]},
                     {"name": "local", "hosts": ["login"]}],
          "pools": [{"name": "hpc", "type": "slurm"}]}


def test_only_the_jobs_of_a_pool_whose_state_changed_are_answered_again():
    state = ControllerState(ClusterConfig.model_validate(CONFIG), {})
    records = PoolRecords()
    views = PoolViews(state, records, FakeClock())
    views.refresh(0.0)
    pending = PendingSet()
    for job_id, queue in ((1, "normal"), (2, "hpc"), (3, "local"), (4, "hpc")):
        pending.add(job(job_id, slots=2, queue=queue))  # more than any host has free: all wait
    worker = SchedulerProcess(timeout=30)

    live: dict[int, str] = {}

    def answered() -> list[int]:
        pending.report_reasons_again(views.reworded(pending.values()))
        hosts = (host("login", 1, 1), HostView("hpc", "unreachable", {"slots": 4}))  # a pool is never up
        worker.send(pending, Snapshot(hosts, (), state.queue_policies), 1_000_000)
        waiting = views.reasons(worker.receive()).waiting
        live.update((i, reason) for reason, ids in waiting for i in ids)
        return sorted(i for _reason, ids in waiting for i in ids)

    try:
        assert answered() == [1, 2, 3, 4]  # the first answer: every reason
        assert views.status(state.config.pools[0]) == "an allocation will be submitted"
        assert answered() == []  # nothing changed
        records.allocs.append(AllocRecord("hpc", 1))  # the pool's state changes: its queues' jobs
        assert answered() == [1, 2, 4]  # (normal may use every host, the pool among them)
        assert "pool hpc: an allocation is being submitted" in live[2] and "pool hpc" not in live[3]
        assert answered() == []
        pending.add(job(5, slots=2, queue="local"))
        assert answered() == [5]
    finally:
        worker.close()
