"""The controller's metrics registry, the pend-reason kinds, the usage series and the Prometheus
text, checked against prometheus-client's own parser."""

from __future__ import annotations

import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from xce_lite.api import prometheus
from xce_lite.controller.metrics import REASON_KINDS, Registry, reason_kind
from xce_lite.store.usage import series


def test_a_histogram_is_cumulative_with_inf_equal_to_count() -> None:
    r = Registry(buckets=(0.01, 0.1, 1.0))
    for value in (0.005, 0.01, 0.05, 0.5, 3.0, -1.0):  # at a bound counts in that bucket; negative as 0
        r.observe("tick", value)
    tick = r.snapshot()["histograms"]["tick"]
    assert tick["buckets"] == [[0.01, 3], [0.1, 4], [1.0, 5], ["+Inf", 6]]
    assert tick["count"] == 6 and tick["sum"] == pytest.approx(3.565)


def test_counters_are_exact_under_threads_and_never_go_down() -> None:
    r = Registry()

    def work() -> None:
        for _ in range(5000):
            r.inc("submits")
            r.inc("finished", state="DONE")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counters = r.snapshot()["counters"]
    assert counters["submits"]["series"] == [{"labels": {}, "value": 40_000}]
    assert counters["finished"]["series"] == [{"labels": {"state": "DONE"}, "value": 40_000}]
    with pytest.raises(ValueError):
        r.inc("submits", -1)
    with pytest.raises(KeyError):
        r.inc("typo")


@pytest.mark.parametrize(("state", "reason", "kind"), [
    ("PSUSP", "held by ann", "held"),
    ("PEND", None, "new"),
    ("PEND", "waiting for its dependency: done(prep): prep (job 41) is RUN", "dependency"),
    ("PEND", "its dependency can never be satisfied: done(5): job 5 is EXIT; it pends as asked", "dependency"),
    ("PEND", "array 7 runs at most 2 elements at once (%2); it waits for one to end", "throttle"),
    ("PEND", "queue short: its running limit of 4 slots is reached (4 in use)", "queue_limit"),
    ("PEND", "user ann: the running limit of 2 slots per user in queue short is reached", "user_limit"),
    ("PEND", "waiting behind job 3, which holds a reservation until it can start", "reservation"),
    ("PEND", "dispatch declined: application changed; it is scheduled again", "declined"),
    ("PEND", "needs at least 4 tasks, at most 2 fit; 2 hosts: mem needed 8G, free at most 4G", "resources"),
    ("PEND", "user1: closed", "resources"),  # a host named like a reason word is still a host
])
def test_reason_kinds(state: str, reason: str | None, kind: str) -> None:
    assert reason_kind(state, reason) == kind
    assert kind in REASON_KINDS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.one_of(st.none(), st.integers(0, 100)),
                          st.one_of(st.none(), st.integers(0, 100)), st.integers(1, 8)), max_size=12),
       st.integers(1, 30))
def test_the_usage_series_counts_like_brute_force(rows, step) -> None:
    since, until = 20.0, 90.0
    jobs = [(float(s), float(s + a) if a is not None else None, float(s + a + e) if a is not None and e is not None
             else None, n) for s, a, e, n in rows]
    points = series(jobs, since, until, float(step))
    assert len(points) == math.ceil((until - since) / step) and points[-1][0] == until
    since = until - len(points) * step  # the steps end at `until`
    busy_total = sum(p[1] for p in points) * step
    expected = sum(max(0.0, min(end if end is not None else until, until) - max(start, since)) * n
                   for _s, start, end, n in jobs if start is not None)
    assert busy_total == pytest.approx(expected, abs=0.0005 * step * len(points))  # rounded to 3 places
    for t, _busy, running, waiting in points:
        assert running == sum(1 for _s, a, e, _n in jobs if a is not None and a <= t < (e if e is not None else 1e9))
        assert waiting == sum(1 for s, a, e, _n in jobs
                              if s <= t < (a if a is not None else (e if e is not None else 1e9)))


def _reply() -> dict:
    r = Registry(buckets=(0.1, 1.0))
    r.observe("tick", 0.05)
    r.observe("session", 2.0)
    r.inc("submits", 3)
    r.inc("finished", state="EXIT")
    return {"schema": 1, "registry": r.snapshot(),
            "jobs": [{"queue": 'we"ird\\q\nx', "state": "PEND", "count": 2}, {"queue": "normal", "state": "RUN",
                                                                                "count": 1}],
            "pending_reasons": {"held": 1, "resources": 1},
            "hosts": [{"name": "gpu1", "state": "up", "resources": {
                "slots": {"total": 8, "used": 3}, "mem": {"total": 2**34, "used": 2**30},
                "gpus": {"total": 2, "used": 1}, "lic": {"total": 4, "used": 0.5}}},
                      {"name": "h2", "state": "lost", "resources": {"slots": {"total": 2, "used": 0}}}]}


def test_the_text_parses_with_prometheus_client() -> None:
    families = {f.name: f for f in text_string_to_metric_families(prometheus.render(_reply()))}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("xce_jobs", (("queue", 'we"ird\\q\nx'), ("state", "PEND")))] == 2  # escaped and back
    assert samples[("xce_host_mem_used_bytes", (("host", "gpu1"),))] == 2**30
    assert samples[("xce_host_gpus_used", (("host", "gpu1"),))] == 1
    assert samples[("xce_host_resource_used", (("host", "gpu1"), ("resource", "lic")))] == 0.5
    assert samples[("xce_host_up", (("host", "h2"),))] == 0
    assert samples[("xce_hosts", (("state", "lost"),))] == 1
    assert samples[("xce_submits_total", ())] == 3
    assert samples[("xce_finished_total", (("state", "EXIT"),))] == 1
    assert families["xce_scheduler_session_duration_seconds"].type == "histogram"
    assert samples[("xce_scheduler_session_duration_seconds_bucket", (("le", "1.0"),))] == 0
    assert samples[("xce_scheduler_session_duration_seconds_bucket", (("le", "+Inf"),))] == 1
    assert families["xce_dispatches"].type == "counter"  # present at 0 before the first dispatch
    assert samples[("xce_dispatches_total", ())] == 0


def test_a_controller_down_is_a_scrape_that_says_so() -> None:
    text = prometheus.render(None, "the controller is not running (nothing answers at /x/xce.sock)\nmore")
    [family] = list(text_string_to_metric_families(text))
    assert family.name == "xce_controller_up" and family.samples[0].value == 0
    assert "# the controller is not running" in text and "more" not in text
