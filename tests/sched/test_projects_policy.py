"""sched/projects.py and sched/fairshare.py: the pure policy, alone and inside `schedule`.

Tables for membership, defaults and never-satisfiable requests; limits that roll up the tree; the
exact pend reasons; fair share's decay, its dynamic priority and the session's order.
"""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sched import G, check_decisions
from xce_lite.errors import SpecError
from xce_lite.sched.core import PendingJob, QueuePolicy, Snapshot, schedule
from xce_lite.sched.fairshare import (
    PROJECT,
    USER,
    Book,
    FairShare,
    FairShareInput,
    QueueShare,
    accrued,
    priority,
    usage_now,
)
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.projects import JOBS, Project, Projects, Usage, ancestors, describe_use
from xce_lite.sched.projects import held as projects_held
from xce_lite.sched.projects import summed
from xce_lite.sched.reasons import FrozenMap
from xce_lite.sched.resreq import parse

H = 3600.0

TREE = Projects(
    (Project("lab", frozenset({"alice"}), limits=FrozenMap({"gpus": 4, "slots": 8})),
     Project("lab/vision", frozenset({"bob"}), frozenset({"vis"}), frozenset({"carol"}),
             FrozenMap({"gpus": 4, JOBS: 2, "mem": 4 * G})),
     Project("lab/vision/gpu-study", frozenset({"dave"}), limits=FrozenMap({"slots": 2})),
     Project("lab/nlp", frozenset({"erin", "bob"})),
     Project("teaching", groups=frozenset({"students"}))),
    default="teaching", group_defaults=FrozenMap({"vis": "lab/vision"}))


def host(name: str, slots: int = 8, gpus: int = 4, mem: int = 64 * G) -> HostView:
    total = {"slots": slots, "gpus": gpus, "mem": mem}
    return HostView(name, "ok", total, None, tuple(range(gpus)))


def job(id: int, n: int = 1, R: str = "", user: str = "bob", project: str | None = "lab/vision",
        queue: str = "normal", max_n: int | None = None, sp: int = 0) -> PendingJob:
    return PendingJob(id, user, queue, JobRequest(id, n, max_n, parse(R)), priority=sp, project=project)


# ---- who may submit where ---------------------------------------------------------------------------


@pytest.mark.parametrize("user, groups, asked, expected", [
    ("bob", (), "lab/vision", "lab/vision"),                 # a member
    ("bob", (), "lab/nlp", "lab/nlp"),                       # in several projects
    ("carol", (), "lab/vision", "lab/vision"),               # an admin may submit
    ("frank", ("vis",), "lab/vision", "lab/vision"),         # by group
    ("frank", ("other", "vis"), None, "lab/vision"),         # the first group with a default
    ("gina", ("students",), None, "teaching"),               # no group default: the cluster's
    ("alice", (), "lab", "lab"),
])
def test_who_may_submit_where(user, groups, asked, expected):
    assert TREE.resolve(user, groups, asked) == expected


@pytest.mark.parametrize("user, groups, asked, words", [
    ("alice", (), "lab/vision", "not a member of project lab/vision (membership is not inherited"),  # not down
    ("dave", (), "lab/vision", "not a member"),                                                       # not up
    ("bob", (), "nope", "there is no project 'nope'; give -P with one of yours: lab/vision, lab/nlp"),
    ("zed", (), None, "the cluster's default project: you (zed) are not a member of project teaching"),
    ("zed", (), "lab", "you are a member of no project"),
    ("frank", ("vis",), "lab", "give -P with one of yours: lab/vision"),
])
def test_who_may_not_and_what_to_do(user, groups, asked, words):
    with pytest.raises(SpecError) as caught:
        TREE.resolve(user, groups, asked)
    assert words in str(caught.value)


def test_open_mode_takes_anyone_and_any_name_until_a_project_is_defined():
    open_mode = Projects()
    assert open_mode.open and open_mode.resolve("zed", (), "any/thing") == "any/thing"
    assert open_mode.resolve("zed", (), None) == "default"
    assert Projects(group_defaults=FrozenMap({"g": "x"})).resolve("zed", ("g",), None) == "x"
    assert open_mode.never(JobRequest(1, 100), "x") is None and open_mode.why_not("zed", (), "x") is None


def test_after_a_change_a_job_outside_its_project_says_why_and_what_to_do():
    assert TREE.why_not("bob", (), "lab/vision") is None
    assert "no longer defined" in TREE.why_not("bob", (), "lab/gone")
    assert "bob is no longer a member of project lab/nlp" in Projects((Project("lab/nlp"),)).why_not(
        "bob", (), "lab/nlp")


@pytest.mark.parametrize("n, R, project, words", [
    (1, "rusage[gpus=5/job]", "lab/vision", "project lab/vision allows at most 4 gpus at once (its limits.gpus); "
                                             "this job needs at least 5"),
    (9, "", "lab/nlp", "project lab allows at most 8 slots"),                 # the parent's limit holds for a child
    (3, "", "lab/vision/gpu-study", "project lab/vision/gpu-study allows at most 2 slots"),
    (2, "rusage[mem=3G]", "lab/vision", "allows at most 4G mem at once"),     # per task: 6G
    (1, "", "lab/vision", None),
    (2, "rusage[gpus=2]", "lab/vision", None),                               # exactly the limit: may run
    (50, "", "teaching", None),                                              # no limits
])
def test_a_request_no_limit_could_ever_allow_is_refused(n, R, project, words):
    why = TREE.never(JobRequest(1, n, None, parse(R)), project)
    assert why == words if words is None else words in why


# ---- limits roll up ---------------------------------------------------------------------------------


def test_a_childs_use_counts_against_every_ancestor():
    usage = Usage(TREE, [("lab/vision/gpu-study", {"slots": 2, "gpus": 3, JOBS: 1})])
    assert usage.of("lab/vision/gpu-study", "slots") == 2
    assert usage.of("lab/vision", "gpus") == 3 and usage.of("lab/vision", JOBS) == 1
    assert usage.of("lab", "gpus") == 3 and usage.of("lab", "slots") == 2
    # lab/nlp has no limit of its own, but its parent's holds it
    why, _ = usage.room("lab/nlp", JobRequest(1, 1, None, parse("rusage[gpus=2]")))
    assert why == "project lab: gpus 3 of 4 in use, the job needs 2"
    usage.add("lab/nlp", {"gpus": 1, "slots": 1, JOBS: 1})
    assert usage.room("lab/vision", JobRequest(1, 1, None, parse("rusage[gpus=1]")))[0] == \
        "project lab: gpus 4 of 4 in use"


def test_room_cuts_a_task_range_to_what_the_limits_leave():
    usage = Usage(TREE, [("lab/nlp", {"slots": 5})])
    why, cut = usage.room("lab/nlp", JobRequest(1, 1, 6))
    assert why is None and (cut.min_tasks, cut.max_tasks) == (1, 3)
    why, cut = usage.room("lab/nlp", JobRequest(1, 4, 6))
    assert why == "project lab: slots 5 of 8 in use, the job needs 4"


def test_a_limit_lowered_below_a_waiting_job_says_waiting_will_not_help():
    usage = Usage(TREE, [])
    assert usage.room("lab/vision/gpu-study", JobRequest(1, 3))[0] == (
        "project lab/vision/gpu-study: the job needs 3 slots, more than its limit of 2; raise limits.slots or "
        "kill the job")


def test_running_jobs_limit_and_use_rolled_up_for_the_listing():
    usage = Usage(TREE, [("lab/vision", {JOBS: 1}), ("lab/vision/gpu-study", {JOBS: 1})])
    assert usage.room("lab/vision", JobRequest(1))[0] == "project lab/vision: running jobs 2 of 2 in use"
    use = describe_use(TREE, [("lab/vision/gpu-study", {"slots": 2, "gpus": 1, JOBS: 1})])
    assert use["lab"]["gpus"] == 1 and use["lab/vision"]["slots"] == 2 and use["lab/nlp"]["slots"] == 0


def test_ancestors_run_from_the_path_to_the_root_and_holdings_sum_per_path():
    assert ancestors("a/b/c") == ("a/b/c", "a/b", "a")
    assert summed([("b", {"slots": 1}), (None, {"slots": 2}), ("b", {"slots": 2, JOBS: 1})]) == (
        (None, FrozenMap({"slots": 2})), ("b", FrozenMap({"slots": 3, JOBS: 1})))


def test_in_a_session_limits_hold_across_the_dispatches_it_makes():
    """Two jobs that each fit alone: the second pends, naming the project and the resource."""
    snapshot = Snapshot((host("h1"), host("h2")), (job(1, R="rusage[gpus=3]"), job(2, R="rusage[gpus=1]"),
                                                   job(3, user="alice", project="lab", R="rusage[gpus=2]")),
                        (QueuePolicy("normal"),), projects=TREE,
                        project_held=(("lab/vision/gpu-study", FrozenMap({"gpus": 0, "slots": 1, JOBS: 1})),))
    decisions = schedule(snapshot)
    check_decisions(snapshot, decisions)
    assert [d.job_id for d in decisions.dispatches] == [1]
    assert dict(decisions.pend_reasons) == {2: "project lab/vision: running jobs 2 of 2 in use",
                                            3: "project lab: gpus 3 of 4 in use, the job needs 2"}


def test_the_placement_itself_is_checked_for_per_host_amounts():
    """1 GPU per host on 3 hosts (ptile=1) is 3 GPUs: over the 2 lab/vision has left."""
    snapshot = Snapshot(tuple(host(f"h{i}") for i in range(3)),
                        (job(1, n=3, R="rusage[gpus=1/host] span[ptile=1]"),), (QueuePolicy("normal"),),
                        projects=TREE, project_held=(("lab/vision", FrozenMap({"gpus": 2})),))
    decisions = schedule(snapshot)
    assert not decisions.dispatches
    assert decisions.pend_reasons == ((1, "project lab/vision: gpus 2 of 4 in use, the job needs 3"),)


def test_without_projects_the_session_is_what_it_was():
    jobs = tuple(job(i, project=None) for i in range(1, 6))
    base = Snapshot((host("h1", slots=3),), jobs, (QueuePolicy("normal"),))
    assert schedule(base) == schedule(Snapshot(base.hosts, jobs, base.queues, projects=Projects()))


# ---- fair share -----------------------------------------------------------------------------------


def test_decay_halves_usage_every_half_life():
    assert accrued(2, 0, H, H, H) == pytest.approx(2 * H / math.log(2) * 0.5)
    assert accrued(1, 0, 10, 10, 1e12) == pytest.approx(10)  # a very long half-life: plain slot-seconds
    book = Book(H, 0.0)
    book.add("alice", "lab", 0, 100, slots=4, gpus=1)
    first = book.at(100)[(USER, "alice")]
    later = book.at(100 + H)[(USER, "alice")]
    assert later[0] == pytest.approx(first[0] / 2) and later[1] == pytest.approx(first[1] / 2)
    assert book.at(100 + H)[(PROJECT, "lab")] == later


def test_usage_weighs_gpu_seconds_and_adds_running_time():
    policy = FairShare(USER, 1e12, gpu_weight=10)
    usage = usage_now(policy, {(USER, "alice"): (100.0, 5.0)}, [("bob", None, 0.0, 2, 1)], 10.0)
    assert usage["alice"] == pytest.approx(150) and usage["bob"] == pytest.approx((2 + 10) * 10)


def test_priority_falls_with_usage_and_running_slots_and_rises_with_share():
    assert priority(1, 0, 0) == 1 and priority(2, 0, 0) == 2
    assert priority(1, 3600, 0) == priority(1, 0, 1) == 0.5


def fair_snapshot(jobs, usage=None, shares=None, slots=4, by=USER, running=None) -> Snapshot:
    policy = FairShare(by, H, FrozenMap(shares or {}))
    fair = FairShareInput((QueueShare("normal", policy, FrozenMap(usage or {})),),
                          FrozenMap({by: FrozenMap(running or {})}))
    return Snapshot((host("h1", slots=slots),), tuple(jobs), (QueuePolicy("normal"),), fairshare=fair)


def test_fair_share_puts_the_less_used_first_whatever_the_submit_order():
    jobs = [job(i, user="alice", project=None) for i in (1, 2, 3)] + \
           [job(i, user="bob", project=None) for i in (4, 5, 6)]
    fifo = schedule(Snapshot((host("h1", slots=3),), tuple(jobs), (QueuePolicy("normal"),)))
    assert [d.job_id for d in fifo.dispatches] == [1, 2, 3]
    decisions = schedule(fair_snapshot(jobs, usage={"alice": 10 * H}, slots=3))
    assert [d.job_id for d in decisions.dispatches] == [4, 5, 6]  # alice's 10 slot-hours: bob first
    even = schedule(fair_snapshot(jobs, slots=4))  # no past: they take turns as each dispatch counts
    assert [d.job_id for d in even.dispatches] == [1, 4, 2, 5]


def test_shares_running_slots_and_job_priority_in_the_order():
    jobs = [job(1, user="alice", project=None), job(2, user="alice", project=None, sp=50),
            job(3, user="bob", project=None)]
    decisions = schedule(fair_snapshot(jobs, shares={"alice": 3}, slots=3))
    assert [d.job_id for d in decisions.dispatches] == [2, 1, 3]  # share 3: 3/(1+1) > 1; -sp within alice's
    decisions = schedule(fair_snapshot(jobs, running={"alice": 5}, slots=1))
    assert [d.job_id for d in decisions.dispatches] == [3]


def test_fair_share_by_project_and_a_plain_queue_of_the_same_level_first():
    jobs = [job(1, user="x", project="a"), job(2, user="y", project="b"), job(3, project=None, queue="plain")]
    snapshot = fair_snapshot(jobs, usage={"a": H}, by=PROJECT, slots=3)
    snapshot = Snapshot(snapshot.hosts, snapshot.jobs, (QueuePolicy("normal"), QueuePolicy("plain")),
                        fairshare=snapshot.fairshare)
    decisions = schedule(snapshot)
    assert [d.job_id for d in decisions.dispatches] == [3, 2, 1]


def test_the_same_fair_share_input_gives_the_same_bytes():
    jobs = [job(i, user=f"u{i % 5}", project=None, n=1 + i % 3) for i in range(1, 300)]
    usage = {f"u{k}": k * 1000.0 for k in range(5)}
    a, b = schedule(fair_snapshot(jobs, usage=usage, slots=64)), schedule(fair_snapshot(jobs, usage=usage, slots=64))
    assert pickle.dumps(a) == pickle.dumps(b)
    check_decisions(fair_snapshot(jobs, usage=usage, slots=64), a)


# ---- properties ---------------------------------------------------------------------------------------

PATHS = ("lab", "lab/vision", "lab/vision/gpu-study", "lab/nlp", "teaching")
SHAPES = ("", "rusage[gpus=1]", "rusage[mem=1G]", "rusage[gpus=1/host] span[ptile=2]", "rusage[mem=2G/job]")


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), st.sampled_from(SHAPES), st.sampled_from(PATHS),
                          st.sampled_from(("alice", "bob", "carol"))), min_size=1, max_size=40),
       st.lists(st.tuples(st.sampled_from(PATHS), st.integers(0, 3), st.integers(0, 2)), max_size=5),
       st.booleans())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_session_never_lets_a_subtree_pass_a_limit_and_examines_each_job_once(jobs, running, fair):
    pending = tuple(job(i, n=n, max_n=n + extra if extra else None, R=R, project=p, user=u)
                    for i, (n, extra, R, p, u) in enumerate(jobs, 1))
    held = tuple((p, FrozenMap({"slots": s, "gpus": g, JOBS: 1})) for p, s, g in running)
    fairshare = FairShareInput((QueueShare("normal", FairShare(USER, H), FrozenMap({"alice": 2 * H})),),
                               FrozenMap({USER: FrozenMap({"bob": 3})})) if fair else None
    snapshot = Snapshot((host("h1", slots=6), host("h2", slots=6, gpus=2), host("h3", slots=4, gpus=0)), pending,
                        (QueuePolicy("normal"),), projects=TREE, project_held=held, fairshare=fairshare)
    decisions = schedule(snapshot)
    check_decisions(snapshot, decisions)
    assert decisions.complete
    assert sorted([d.job_id for d in decisions.dispatches] + [i for i, _r in decisions.pend_reasons]) == \
        [j.id for j in pending]
    by_id = {j.id: j for j in pending}
    totals = Usage(TREE, list(held) + [(by_id[d.job_id].project, projects_held(d.placement))
                                       for d in decisions.dispatches])
    before = Usage(TREE, held)
    for project in TREE.projects:
        for resource, limit in project.limits.items():
            now = totals.of(project.path, resource)
            # within the limit, or no new use on a subtree that was already over it
            assert now <= limit or now == before.of(project.path, resource), (project.path, resource)
    assert schedule(snapshot) == decisions
