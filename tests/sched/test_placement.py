"""Tests of the placement engine: a table per rule, the XCE task-range bug, GPU indices, grouped
reasons, why_never. Its hypothesis properties are in test_placement_properties.py."""

from __future__ import annotations

import pickle

import pytest

from tests.support.placement import host, job, placed, slots_only
from tests.support.sched import G
from xce_lite.errors import SpecError
from xce_lite.sched.placement import FrozenMap, HostView, JobRequest, attributes, place, why_never
from xce_lite.sched.reasons import (
    HostDown,
    NoFirstHost,
    NoHosts,
    NoTaskCount,
    NoValue,
    Refusal,
    SelectFalse,
    SharedShort,
    Short,
    TooFewTasks,
    format_amount,
)


# ---------------------------------------------------------------- task range


def test_a_job_whose_minimum_fits_starts_now_with_what_fits():
    # XCE bug-1931: a job asking for 2..5 tasks pended while 2 slots were free.
    result = place(job((2, 5)), [host("h1", slots=4, used={"slots": 2})])
    assert placed(result) == (("h1", 2),)


def test_the_most_tasks_that_fit_up_to_the_maximum():
    assert placed(place(job((2, 5)), slots_only(4, 4))) == (("h1", 4), ("h2", 1))
    assert placed(place(job((2, 16)), slots_only(4, 4))) == (("h1", 4), ("h2", 4))


def test_fewer_than_the_minimum_pends_with_the_numbers():
    result = place(job((4, 8)), [host("h1", slots=4, used={"slots": 2})])
    assert isinstance(result, Refusal)
    assert result.job_reasons == (TooFewTasks(4, 2),)
    assert result.summary() == "needs at least 4 tasks, at most 2 fit"
    assert result.capacity == (("h1", 2),)


def test_hosts_are_filled_in_name_order_whatever_order_they_come_in():
    hosts = slots_only(2, 2, 2)
    assert placed(place(job(3), hosts[::-1])) == (("h1", 2), ("h2", 1))


@pytest.mark.parametrize("low, high", [(0, 1), (3, 2), (-1, 4)])
def test_a_bad_task_range_is_a_spec_error(low, high):
    with pytest.raises(SpecError, match="-n"):
        JobRequest(1, low, high)


def test_max_tasks_defaults_to_min_tasks():
    assert JobRequest(7, 3).max_tasks == 3


def test_a_request_crosses_a_pipe_whole():
    request = job((2, 6), "select[avx] rusage[mem=1G] span[ptile=2]", id=42)
    again = pickle.loads(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
    assert again == request and hash(again) == hash(request) and type(again) is JobRequest
    assert (again.id, again.min_tasks, again.max_tasks, again.resreq) == (42, 2, 6, request.resreq)
    with pytest.raises(AttributeError):
        again.min_tasks = 1  # type: ignore[misc]


# ---------------------------------------------------------------- span rules


@pytest.mark.parametrize("caps, n, span, expected", [
    ((4, 4, 4), 10, "ptile=4", (("h1", 4), ("h2", 4), ("h3", 2))),
    ((4, 2, 4), (1, 10), "ptile=4", (("h1", 4), ("h3", 4), ("h2", 2))),  # the partial host goes last
    ((3, 3, 3), (1, 8), "ptile=4", (("h1", 3),)),  # no host has a full tile: one host alone
    ((4, 4), (1, 8), "ptile=2", (("h1", 2), ("h2", 2))),
    ((4, 4, 4), (1, 8), "ptile=2:maxhosts=2", (("h1", 2), ("h2", 2))),
    ((2, 4), (3, 6), "hosts=1", (("h2", 4),)),
    ((3, 3), (1, 7), "block=2", (("h1", 2), ("h2", 2))),
    ((4, 1), (1, 6), "block=2", (("h1", 4),)),
    ((1, 4, 2, 4), (1, 8), "maxhosts=2", (("h2", 4), ("h4", 4))),
    ((1, 4, 2, 4), (1, 5), "maxhosts=2", (("h1", 1), ("h2", 4))),  # earliest hosts that still reach 5
    # h1..h3 already hold 5 tasks, but only h4 lets h1 in: the look-ahead reads past the hosts that fit
    ((1, 3, 3, 4), 5, "maxhosts=2", (("h1", 1), ("h4", 4))),
    ((1, 3, 3, 4), 4, "hosts=1", (("h4", 4),)),
    ((3, 1, 1, 2, 4), 5, "ptile=2", (("h1", 2), ("h4", 2), ("h2", 1))),
    ((1, 1, 1), (1, 3), "maxhosts=1", (("h1", 1),)),
])
def test_span_rules(caps, n, span, expected):
    assert placed(place(job(n, f"span[{span}]"), slots_only(*caps))) == expected


@pytest.mark.parametrize("caps, n, span, summary", [
    ((1, 1, 1, 1, 1), 5, "ptile=2", "needs at least 5 tasks, at most 1 fit with span[ptile=2]"),
    ((2, 4), 6, "hosts=1", "needs at least 6 tasks, at most 4 fit with span[hosts=1]"),
    ((3, 3), (4, 8), "block=4", "needs at least 4 tasks, none fit with span[block=4]"),
    ((4, 4, 4), 9, "maxhosts=2", "needs at least 9 tasks, at most 8 fit with span[maxhosts=2]"),
    ((4, 4), (3, 3), "block=2", "span[block=2] needs a multiple of 2 tasks, and -n 3,3 allows none"),
])
def test_span_rules_that_cannot_be_met_say_so(caps, n, span, summary):
    result = place(job(n, f"span[{span}]"), slots_only(*caps))
    assert isinstance(result, Refusal)
    assert result.summary() == summary


def test_block_counts_whole_blocks_only():
    result = place(job((1, 5), "span[block=2]"), slots_only(3, 3))
    assert placed(result) == (("h1", 2), ("h2", 2))
    assert isinstance(place(job((3, 3), "span[block=2]"), slots_only(8)), Refusal)
    assert place(job((3, 3), "span[block=2]"), slots_only(8)).job_reasons == (NoTaskCount(3, 3, 2),)


# ---------------------------------------------------------------- same, order, select, state


def test_same_picks_the_group_with_the_most_tasks():
    hosts = [host("a1", 2, type="A"), host("a2", 2, type="A"), host("b1", 8, type="B")]
    assert placed(place(job((1, 6), "same[type]"), hosts)) == (("b1", 6),)
    # Both groups can take 3: the tie goes to the group whose first host comes first.
    assert placed(place(job((1, 3), "same[type]"), hosts)) == (("a1", 2), ("a2", 1))


def test_same_that_cannot_be_met_names_the_attribute():
    hosts = [host("a1", 4, type="A"), host("b1", 4, type="B"), host("b2", 4, type="B")]
    assert place(job(9, "same[type]"), hosts).summary() == \
        "needs at least 9 tasks, at most 8 fit on hosts with the same type"


def test_same_breaks_a_tie_by_the_earliest_host():
    hosts = [host("b1", 2, type="B"), host("a1", 2, type="A"), host("a2", 2, type="A")]
    assert placed(place(job((1, 2), "same[type]"), hosts)) == (("a1", 2),)
    assert placed(place(job((1, 4), "same[type]"), hosts)) == (("a1", 2), ("a2", 2))


def test_a_host_without_the_same_attribute_joins_no_group():
    result = place(job(1, "same[model]"), [host("h1", type="A")])
    assert isinstance(result, Refusal)
    assert result.hosts[0].reasons == (NoValue("model"),)
    assert result.summary() == "h1: no model for same[model]"


@pytest.mark.parametrize("R, expected", [
    ("", ("h1", "h2", "h3")),
    ("order[-mem]", ("h2", "h3", "h1")),  # most free memory first
    ("order[mem]", ("h1", "h3", "h2")),
    ("order[-slots:-mem]", ("h2", "h3", "h1")),
    ("order[-scratch]", ("h3", "h1", "h2")),  # hosts without the resource come last
])
def test_order_sorts_hosts_by_free_amounts_then_name(R, expected):
    hosts = [host("h1", mem="8G", used={"mem": "6G"}), host("h2", mem="8G"),
             host("h3", mem="8G", used={"mem": "2G"}, res={"scratch": 5})]
    result = place(job(12, R), hosts)
    assert tuple(name for name, _ in placed(result)) == expected


def test_select_reads_what_a_host_is_not_what_is_free():
    hosts = [host("big", mem="16G", used={"mem": "14G"}), host("small", mem="4G")]
    assert placed(place(job(1, "select[mem>8G]"), hosts)) == (("big", 1),)
    result = place(job(1, "select[mem>8G] rusage[mem=8G]"), hosts)
    assert result.summary() == "big: mem needed 8G, free 2G; small: does not match select[mem>8G]"


def test_select_on_attributes_tags_and_max_names():
    hosts = [host("h1", type="X86_64", tags=("avx512",)), host("h2", mem="32G", type="ARM")]
    assert placed(place(job(1, 'select[type=="ARM"]'), hosts)) == (("h2", 1),)
    assert placed(place(job(1, "select[avx512]"), hosts)) == (("h1", 1),)
    assert placed(place(job(1, "select[maxmem>16G]"), hosts)) == (("h2", 1),)
    assert attributes(hosts[0]) == {"slots": 4, "mem": 8 * G, "gpus": 0, "maxslots": 4, "maxmem": 8 * G,
                                     "maxgpus": 0, "type": "X86_64", "avx512": True}


def test_closed_and_unreachable_hosts_take_nothing():
    hosts = [host("h1", state="closed"), host("h2", state="unreachable"), host("h3", slots=1)]
    assert placed(place(job((1, 4)), hosts)) == (("h3", 1),)
    result = place(job(2), hosts)
    assert result.summary() == "needs at least 2 tasks, at most 1 fit; h1: closed; h2: unreachable"


def test_no_hosts_at_all():
    assert place(job(1), []) == Refusal(1, (NoHosts(),))


# ---------------------------------------------------------------- rusage, shared counters, GPUs


def test_rusage_per_task_and_per_host():
    result = place(job((1, 8), "rusage[mem=2G]"), [host("h1", slots=4, mem="8G")])
    assert placed(result) == (("h1", 4),)
    assert result.allocs[0].reserved == {"slots": 4, "mem": 8 * G}
    result = place(job((1, 8), "rusage[mem=1G/host]"), [host("h1", mem="2G"), host("h2", mem="2G")])
    assert [a.reserved for a in result.allocs] == [{"slots": 4, "mem": G}, {"slots": 4, "mem": G}]
    result = place(job((1, 8), "rusage[scratch=2/host, mem=2G]"),
                   [host("h1", slots=4, mem="7G", res={"scratch": 2})])
    assert placed(result) == (("h1", 3),)


def test_fractional_amounts_compare_exactly_as_floats():
    # 3 * 0.1 is 0.30000000000000004 in floating point, more than 0.3: two tasks, never an overdraw.
    result = place(job((1, 8), "rusage[bw=0.1]"), [host("h1", slots=8, res={"bw": 0.3})])
    assert placed(result) == (("h1", 2),)
    assert result.allocs[0].reserved["bw"] == 0.2


def test_a_bare_memory_amount_is_megabytes():
    result = place(job(1, "rusage[mem=512]"), [host("h1")])
    assert result.allocs[0].reserved["mem"] == 512 * 1024**2


def test_per_job_rusage_goes_once_on_the_first_host_which_must_hold_it():
    hosts = [host("h1", mem="4G"), host("h2", mem="8G")]
    result = place(job((1, 4), "rusage[mem=5G/job]"), hosts)
    assert placed(result) == (("h2", 4),)
    assert result.allocs[0].reserved == {"slots": 4, "mem": 5 * G}
    result = place(job((1, 8), "rusage[mem=5G/job]"), hosts)
    assert placed(result) == (("h2", 4), ("h1", 4))  # the first host first, then in order
    assert [a.reserved.get("mem") for a in result.allocs] == [5 * G, None]


def test_per_job_rusage_tries_each_host_as_the_first():
    # Both hosts can hold the per-job scratch; with h1 first the job would get 2 tasks, with h2 first 4.
    hosts = [host("h1", slots=2, res={"scratch": 1}), host("h2", slots=4, res={"scratch": 1})]
    assert placed(place(job((1, 8), "rusage[scratch=1/job] span[hosts=1]"), hosts)) == (("h2", 4),)
    # Under ptile the first host must be a full one unless it is alone.
    hosts = [host("h1", slots=2, res={"scratch": 1}), host("h2", slots=4, res={"scratch": 1}), host("h3")]
    result = place(job((1, 8), "rusage[scratch=1/job] span[ptile=4]"), hosts)
    assert placed(result) == (("h2", 4), ("h3", 4))
    assert [a.reserved.get("scratch") for a in result.allocs] == [1, None]


def test_per_job_rusage_no_host_can_hold():
    result = place(job(1, "rusage[mem=10G/job]"), [host("h1"), host("h2")])
    assert result.job_reasons == (TooFewTasks(1, 0), NoFirstHost("mem=10G/job"))


def test_shared_counters_are_checked_once_for_the_whole_job():
    assert placed(place(job((1, 8), "rusage[lic=1]"), [host("h1", slots=8)], {"lic": 3})) == (("h1", 3),)
    hosts = [host(f"h{i}", slots=2) for i in range(1, 5)]
    result = place(job((1, 8), "rusage[lic=2/host]"), hosts, {"lic": 5})
    assert placed(result) == (("h1", 2), ("h2", 2))
    assert result.shared == {"lic": 4}
    result = place(job((1, 8), "rusage[lic=1/job]"), hosts, {"lic": 1})
    assert result.tasks == 8 and result.shared == {"lic": 1}
    assert all("lic" not in a.reserved for a in result.allocs)


def test_a_short_shared_counter_is_a_job_reason():
    result = place(job(1, "rusage[lic=4]"), [host("h1")], {"lic": 3})
    assert result.job_reasons == (TooFewTasks(1, 0), SharedShort("lic", 4, 3))
    assert result.summary() == "needs at least 1 task, none fit; lic needed 4, free 3 (shared by the cluster)"


def test_gpus_get_the_lowest_free_indices():
    result = place(job(2, "rusage[gpus=1]"), [host("h1", gpus=4, gpu_used=(0, 2))])
    assert result.allocs[0].gpus == (1, 3)
    assert result.allocs[0].reserved["gpus"] == 2
    result = place(job((1, 8), "rusage[gpus=2/host]"), [host("h1", gpus=2), host("h2", gpus=4, gpu_used=(0,))])
    assert [(a.host, a.gpus) for a in result.allocs] == [("h1", (0, 1)), ("h2", (1, 2))]
    result = place(job(3, "rusage[gpus=1]"), [host("h1", gpus=2)])
    assert result.summary() == "needs at least 3 tasks, at most 2 fit"


def test_gpu_indices_must_match_the_free_count():
    with pytest.raises(ValueError, match="free gpus"):
        HostView("h1", total={"gpus": 2}, free={"gpus": 2}, gpu_free=(0,))
    with pytest.raises(ValueError, match="state"):
        HostView("h1", state="down")
    with pytest.raises(ValueError, match="same resources"):
        HostView("h1", total={"slots": 2}, free={"mem": 2})


# ---------------------------------------------------------------- reasons and their display


def test_hosts_with_the_same_shortage_are_grouped():
    hosts = [host("host1", used={"mem": "6G"}), host("host2", state="closed"),
             host("host3", used={"mem": "4G"}), host("host4", used={"mem": "5G"})]
    result = place(job(1, "rusage[mem=8G]"), hosts)
    assert result.summary() == "3 hosts: mem needed 8G, free at most 4G; host2: closed"
    assert result.hosts[0].reasons == (Short("mem", 8 * G, 2 * G),)
    assert result.details() == ("host1: mem needed 8G, free 2G", "host2: closed",
                                "host3: mem needed 8G, free 4G", "host4: mem needed 8G, free 3G")


def test_every_short_resource_on_a_host_is_named():
    result = place(job(1, "rusage[mem=16G, gpus=1]"), [host("h1", gpus=1, gpu_used=(0,))])
    assert result.summary() == "h1: gpus needed 1, free 0, mem needed 16G, free 8G"


def test_select_and_state_reasons():
    hosts = [host("h1", type="A"), host("h2", type="A", state="unreachable"), host("h3", type="B")]
    result = place(job(1, 'select[type=="C"]'), hosts)
    assert result.hosts[0].reasons == (SelectFalse('type=="C"'),)
    assert result.hosts[1].reasons == (HostDown("unreachable"),)
    assert result.summary() == '2 hosts: does not match select[type=="C"]; h2: unreachable'


def test_refusals_cross_the_pool_and_compare_equal():
    result = place(job(4, "rusage[mem=8G]"), [host("h1", used={"mem": "4G"}), host("h2")])
    assert pickle.loads(pickle.dumps(result)) == result
    assert hash(pickle.loads(pickle.dumps(result))) == hash(result)
    assert result.details() == ("needs at least 4 tasks, at most 1 fit", "h1: mem needed 8G, free 4G",
                                "h2: can take 1 task")


@pytest.mark.parametrize("resource, value, text", [
    ("mem", 8 * G, "8G"), ("mem", 1536 * 1024**2, "1.5G"), ("mem", 0, "0"), ("mem", 512, "512B"),
    ("tmp", 1024**4, "1T"), ("mem", 1280 * 1024**2, "1.25G"), ("gpus", 2, "2"), ("lic", 0.5, "0.5"),
])
def test_format_amount(resource, value, text):
    assert format_amount(resource, value) == text


def test_frozen_map():
    m = FrozenMap({"b": 2, "a": 1})
    assert list(m) == ["a", "b"] and m == {"a": 1, "b": 2} and m["a"] == 1 and m.get("c", 3) == 3
    assert hash(m) == hash(FrozenMap([("a", 1), ("b", 2)])) and pickle.loads(pickle.dumps(m)) == m
    with pytest.raises(AttributeError):
        m.x = 1  # type: ignore[attr-defined]


# ---------------------------------------------------------------- why_never


@pytest.mark.parametrize("n, R, shared, expected", [
    (1, 'select[type=="ARM"]', {}, 'no host matches select[type=="ARM"]'),
    (1, "rusage[gpu=1]", {}, "unknown resource gpu (did you mean gpus?) in -R; the cluster knows: "),
    (1, "select[defined(modle)]", {}, "unknown resource modle (did you mean model?)"),
    (1, "rusage[mem=100G]", {}, "needs 100G mem on one host for one task, and the largest host has 16G"),
    (1, "select[maxmem<10G] rusage[mem=10G]", {},
     "needs 10G mem on one host for one task, and the largest host that matches the select has 8G"),
    (1, "rusage[type=1]", {}, "rusage[type=1]: type is an attribute, not a resource a job can reserve"),
    (1, "rusage[slots=2]", {}, "rusage[slots=2]: every task holds one slot"),
    (1, "rusage[gpus=0.5]", {}, "rusage[gpus=0.5]: GPUs are whole devices"),
    ((3, 3), "span[block=2]", {}, "span[block=2] needs a multiple of 2 tasks, and -n 3,3 allows none"),
    (6, "rusage[lic=2]", {"lic": 10}, "needs 12 lic, and the cluster has 10"),
    (8, "span[ptile=2:maxhosts=3]", {},
     "can never start, even on an empty cluster: needs at least 8 tasks, at most 6 fit with span[ptile=2:maxhosts=3]"),
    (5, "span[hosts=1]", {}, "can never start, even on an empty cluster: needs at least 5 tasks, at most 4 fit"),
])
def test_why_never(n, R, shared, expected):
    hosts = [host("h1", model="EPYC", type="X86_64"), host("h2", mem="16G", gpus=2, state="closed"),
             host("h3", gpus=1, gpu_used=(0,), used={"slots": 4})]
    assert why_never(job(n, R), hosts, shared).startswith(expected)


@pytest.mark.parametrize("n, R", [
    (12, ""),  # closed and busy hosts count: they may open and empty
    (2, "rusage[gpus=1]"),
    (1, "rusage[mem=16G, gpu=0]"),  # name=0 means no term, so an unknown name there is harmless
    (1, "select[mem>8G] rusage[mem=16G] order[-gpus]"),
])
def test_why_never_lets_satisfiable_jobs_pass(n, R):
    hosts = [host("h1"), host("h2", mem="16G", gpus=2, state="closed"), host("h3", gpus=1, used={"slots": 4})]
    assert why_never(job(n, R), hosts) is None


def test_why_never_with_no_hosts():
    assert why_never(job(1), []) == "the cluster has no hosts"
