"""A dispatch carries what its launch needs from the plan (issue 18): the launch reads nothing back
from the store, and each host is asked to run exactly what the stored row says (the launch requests
made from the row as the store holds it); after a restart a launch reads the stored row."""

from __future__ import annotations

from collections import Counter

from tests.support.inproc import InProc
from xce_lite import errors
from xce_lite.controller.invariants import check_invariants
from xce_lite.controller.jobunits import launch_requests
from xce_lite.store.jobs import JobStore

APPS = """\
    applications:
      tool:
        env: {TOOL_HOME: /opt/tool, SHARED: profile}
        limits: {run_limit: 10m}
        params:
          STYLE: {default: plain}
        annotations: {lab.owner: docs}
        hooks:
          pre_job_exec: {argv: [sh, -c, 'true'], timeout: 30s}
          post_host_exec: {argv: [sh, -c, 'true']}
    """


class CountingStore(JobStore):
    """The real store, counting the job rows each `jobs` call reads by id (and those it reads through
    the writer connection, whose cache outlives the tick's commits: JobReads.jobs)."""

    reads: Counter[int]
    by_writer: Counter[int]

    def jobs(self, ids=None, *args, **kw):
        if ids:
            type(self).reads.update(ids)
            if kw.get("writer"):
                type(self).by_writer.update(ids)
        return super().jobs(ids, *args, **kw)


def recording(p: InProc) -> list:
    """Every launch request the fake hosts receive, in order."""
    sent: list = []
    for host in p.hosts.values():
        def launch(requests, _launch=host.launch):
            sent.extend(requests)
            return _launch(requests)
        host.launch = launch
    return sent


def expected(p: InProc, job_id: int) -> list:
    """The launch requests made from the job's row as the store holds it."""
    row = p.ctl.store.get(job_id)
    queue = p.ctl.config.queue(row.queue)
    return [u.request for u in launch_requests(p.ctl.cluster, row, p.ctl.config.controller.grace,
                                               row.spec.run_limit or queue.run_limit,
                                               row.spec.mem_limit or queue.mem_limit, p.ctl.state.addresses)]


def test_a_dispatch_reads_its_row_once_and_launches_what_is_stored():
    CountingStore.reads, CountingStore.by_writer = Counter(), Counter()
    p = InProc(hosts=("h1", "h2", "h3"), applications=APPS, store_class=CountingStore)
    try:
        p.step(0.1)  # the hosts come up
        sent = recording(p)
        ids = [p.submit(runtime=30, app="tool", env={"SHARED": "job", "MINE": "1"}),
               p.submit(runtime=30, slots=3),  # on both hosts: two units
               p.submit(runtime=30, app="tool")]
        read: Counter[int] = Counter()
        for _ in range(2):  # dispatched and launched; the launches' replies stored
            CountingStore.reads.clear()
            p.step(1.0)
            read.update(CountingStore.reads)  # the ticks' reads (the invariants' own are not counted)
            check_invariants(p.ctl)
        assert {p.job(i).state for i in ids} == {"RUN"}
        # the plan's read checks the job is still PEND; the launch reads nothing back
        assert {i: read[i] for i in ids} == dict.fromkeys(ids, 1)
        assert {i: CountingStore.by_writer[i] for i in ids} == dict.fromkeys(ids, 1)  # the plan's read
        by_unit = {r.unit: r for r in sent}
        for job_id in ids:
            for request in expected(p, job_id):
                assert by_unit[request.unit] == request, f"job {job_id}: launched as the store says"
        assert len(sent) == 4
        assert by_unit[p.job(ids[0]).unit].env["TOOL_HOME"] == "/opt/tool"
    finally:
        p.close()


def test_after_a_restart_a_launch_reads_the_stored_row():
    """A dispatch stored but never launched (its host refused the connection at the launch) is
    launched after a restart from the stored row, as its dispatch would have launched it."""
    CountingStore.reads, CountingStore.by_writer = Counter(), Counter()
    p = InProc(hosts=("h1",), applications=APPS, store_class=CountingStore)
    try:
        p.step(0.1)
        host = p.hosts["h1"]

        def unreachable(requests):
            raise errors.HostUnreachable("cut off at the launch (the test's fault)")
        host.launch_nowait = unreachable
        a = p.submit(runtime=30, app="tool")
        p.step(1.0)
        assert p.job(a).state == "DISP" and not host.units
        del host.launch_nowait  # the host takes launches again
        p.restart()
        assert p.ctl.state.active[a].launch_with is None  # loaded from the store
        sent = recording(p)
        read: Counter[int] = Counter()
        for _ in range(3):
            CountingStore.reads.clear()
            p.step(1.0)
            read.update(CountingStore.reads)
            check_invariants(p.ctl)
        assert p.job(a).state == "RUN"
        assert read[a] == 1, "the restart's launch reads the stored row"
        assert [r for r in sent if r.unit == p.job(a).unit] == expected(p, a)
    finally:
        p.close()
