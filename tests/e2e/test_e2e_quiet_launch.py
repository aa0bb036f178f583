"""A real controller whose tick period is long (60 s): a launch's replies do not wake its tick (they
only say the units run), yet the job's start is stored within moments, since `serve` sleeps no longer
than START_WAIT while replies are due and while starts wait for a commit; a kill and the next job's
launch go on as usual, and a controller killed -9 with a start not stored yet adopts the job."""

from __future__ import annotations

from tests.support.cluster import running_cluster
from tests.support.waiting import wait_until
from xce_lite.store.jobs import JobStore

CONFIG = """\
    cluster: quiet{pid}
    hosts:
      - name: local
        slots: 1
        mem: 1G
    queues:
      - name: normal
        default: true
    controller:
      tick: 60s
      grace: 2s
    """


def _stored_state(c, job_id: int) -> str:
    store = JobStore(c.home / "xce.db", readonly=True)
    try:
        return store.get(job_id).state
    finally:
        store.close()


def test_a_start_is_stored_within_moments_though_launch_replies_do_not_wake_a_60s_tick():
    import os

    with running_cluster(config=CONFIG.format(pid=os.getpid())) as c:
        first = c.submit("sleep", "300")
        wait_until(lambda: _stored_state(c, first) == "RUN", 10, f"job {first} stored RUN (tick period 60 s)")
        second = c.submit("sleep", "300")
        c.kill9_controller()  # second is pending; first runs; then a restart adopts first
        c.start()
        wait_until(lambda: _stored_state(c, first) == "RUN", 20, f"job {first} still RUN after the restart")
        c.ok("kill", str(first))
        c.wait_state(first, {"EXIT"}, timeout=20)
        wait_until(lambda: _stored_state(c, second) == "RUN", 20, f"job {second} stored RUN in the freed slot")
        c.ok("kill", str(second))
        c.wait_state(second, {"EXIT"}, timeout=20)
        ran = c.job(first)
        assert ran["state"] == "EXIT"
