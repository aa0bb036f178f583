"""merge.py: every rule of the merge of job + profile + queue, as tables, and a property: the merge
never removes a profile value (only a job's own rusage term may replace a profile default).

Pure: profiles are built here from `-R` texts, with no configuration file.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_lite.config.merge import merge
from xce_lite.config.merge_values import (
    DEFAULT,
    JOB,
    PRESET,
    PROFILE,
    QUEUE,
    Effective,
    Hook,
    Param,
    Profile,
    ProfileResources,
    QueueLimits,
    RusageEntry,
    annotation_env_name,
)
from xce_lite.config.merge_view import changed_fields, describe
from xce_lite.errors import SpecError
from xce_lite.models import JobSpec
from xce_lite.sched import resreq as rr
from xce_lite.sched.reasons import FrozenMap

GiB, MiB = 1024**3, 1024**2
QUEUE_ANY = QueueLimits("normal")


def resources(select=None, rusage=(), span=None, same=(), order=None) -> ProfileResources:
    """rusage entries as `name=amount[/per]` (a default) or `name/per` (required, no default)."""
    entries = []
    for text in rusage:
        if "=" in text:
            term = rr.parse(f"rusage[{text}]").rusage[0]
            entries.append(RusageEntry(term.name, term.per, term))
        else:
            name, _, per = text.partition("/")
            entries.append(RusageEntry(name, per or "task"))
    return ProfileResources(
        select=rr.parse(f"select[{select}]").select if select else None, rusage=tuple(entries),
        span=rr.parse(f"span[{span}]").span if span else None, same=tuple(sorted(same)),
        order=rr.parse(f"order[{order}]").order if order else ())


def profile(name="app", **kw) -> Profile:
    res = {k: kw.pop(k) for k in ("select", "rusage", "span", "same", "order") if k in kw}
    return Profile(name, resources=resources(**res), **kw)


def job(*resreq: str, **kw) -> JobSpec:
    return JobSpec(argv=("true",), cwd="/", resreq=resreq, app=kw.pop("app", "app"), **kw)


def effective_resreq(spec: JobSpec, prof: Profile | None, queue: QueueLimits = QUEUE_ANY) -> str:
    return rr.format(merge(spec, prof, queue).resreq)


# ---- resource requirements ------------------------------------------------------------------------

RESREQ_TABLE = [
    # (what, profile, job -R, effective -R)
    ("rusage is the union", dict(rusage=["mem=2G"]), ["rusage[lic=1/job]"], "rusage[lic=1/job, mem=2G]"),
    ("the job's term wins, higher", dict(rusage=["mem=2G"]), ["rusage[mem=4G]"], "rusage[mem=4G]"),
    ("the job's term wins, lower", dict(rusage=["mem=2G"]), ["rusage[mem=512M]"], "rusage[mem=512M]"),
    ("the job's term wins whole, unit of size too", dict(rusage=["mem=2G/host"]), ["rusage[mem=3072/host]"],
     "rusage[mem=3072/host]"),
    ("name=0 drops a profile default", dict(rusage=["mem=2G", "lic=1/job"]), ["rusage[mem=0]"],
     "rusage[lic=1/job]"),
    ("name=0 drops the job's own term", dict(), ["rusage[tmp=0, mem=1G]"], "rusage[mem=1G]"),
    ("a required entry the job gives", dict(rusage=["scratch/host"]), ["rusage[scratch=10G/host]"],
     "rusage[scratch=10G/host]"),
    ("select is ANDed", dict(select="avx512"), ["select[mem>4G]"], "select[avx512 && mem>4G]"),
    ("the same select once", dict(select="avx512"), ["select[avx512]"], "select[avx512]"),
    ("the profile's select alone", dict(select="avx512"), [], "select[avx512]"),
    ("span: the profile's", dict(span="ptile=4"), [], "span[ptile=4]"),
    ("span: a job may repeat it", dict(span="ptile=4"), ["span[ptile=4]"], "span[ptile=4]"),
    ("span: the job's when the profile has none", dict(), ["span[hosts=1]"], "span[hosts=1]"),
    ("same is the union", dict(same=["model"]), ["same[type]"], "same[model:type]"),
    ("order: the profile's keys first", dict(order="-mem"), ["order[slots]"], "order[-mem:slots]"),
    ("order: a profile key repeated", dict(order="-mem"), ["order[-mem]"], "order[-mem]"),
]


@pytest.mark.parametrize("what, prof, resreq, expected", RESREQ_TABLE, ids=[row[0] for row in RESREQ_TABLE])
def test_resource_rules(what, prof, resreq, expected):
    assert effective_resreq(job(*resreq), profile(**prof)) == expected


REFUSED_TABLE = [
    ("units (per) must match", dict(rusage=["lic=1/job"]), ["rusage[lic=2]"], "so the unit must match: write "
                                                                                "rusage[lic=2/job]"),
    ("per host is not per task", dict(rusage=["mem=2G/host"]), ["rusage[mem=4G]"], "reserves mem per host"),
    ("a required entry left out", dict(rusage=["scratch/host"]), [], "needs every job to reserve scratch per host"),
    ("a required entry set to 0", dict(rusage=["scratch/host"]), ["rusage[scratch=0/host]"], "ask for more than 0"),
    ("another span", dict(span="ptile=4"), ["span[ptile=2]"], "fixes span[ptile=4]"),
    ("a profile order key turned around", dict(order="-mem"), ["order[mem]"], "not turn one around"),
]


@pytest.mark.parametrize("what, prof, resreq, message", REFUSED_TABLE, ids=[row[0] for row in REFUSED_TABLE])
def test_refused_requests_say_which_rule(what, prof, resreq, message):
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        merge(job(*resreq), profile(**prof), QUEUE_ANY)


def test_without_a_profile_the_job_is_as_it_asked():
    eff = merge(job("rusage[mem=1G] span[ptile=2]", app=""), None, QUEUE_ANY)
    assert (eff.app, eff.profile_hash, rr.format(eff.resreq)) == ("", "", "rusage[mem=1G] span[ptile=2]")
    assert (eff.min_tasks, eff.max_tasks, eff.run_limit) == (1, 1, None)


# ---- limits, tasks and queue ceilings ---------------------------------------------------------------

LIMITS_TABLE = [
    # (what, profile limit, job -W, queue ceiling, effective, origin)
    ("nothing anywhere", None, None, None, None, DEFAULT),
    ("the queue's ceiling as a default", None, None, 3600, 3600, QUEUE),
    ("the profile's", 1800, None, 3600, 1800, PROFILE),
    ("a job may ask for less than the profile", 1800, 600, 3600, 600, JOB),
    ("the job's under the ceiling", None, 600, 3600, 600, JOB),
]


@pytest.mark.parametrize("what, prof_limit, job_limit, ceiling, expected, origin", LIMITS_TABLE,
                         ids=[row[0] for row in LIMITS_TABLE])
def test_run_limits(what, prof_limit, job_limit, ceiling, expected, origin):
    eff = merge(job(run_limit=job_limit), profile(run_limit=prof_limit), QueueLimits("q", run_limit=ceiling))
    assert (eff.run_limit, eff.origins["run_limit"]) == (expected, origin)


@pytest.mark.parametrize("prof_limit, job_limit, ceiling, message", [
    (1800, 3600, None, "-W 1:00:00 is above application app's run limit of 0:30:00"),
    (None, 7200, 3600, "run limit -W 2:00:00 is above queue q's ceiling of 1:00:00"),
    (7200, None, 3600, "application app's run limit of 2:00:00 is above queue q's ceiling of 1:00:00"),
])
def test_run_limits_that_could_never_hold_are_refused(prof_limit, job_limit, ceiling, message):
    with pytest.raises(SpecError, match=message):
        merge(job(run_limit=job_limit), profile(run_limit=prof_limit), QueueLimits("q", run_limit=ceiling))


def test_memory_limits_follow_the_same_rules():
    queue = QueueLimits("q", mem_limit=8 * GiB)
    assert merge(job(), profile(mem_limit=4 * GiB), queue).mem_limit == 4 * GiB
    assert merge(job(mem_limit=GiB), profile(mem_limit=4 * GiB), queue).mem_limit == GiB
    with pytest.raises(SpecError, match="-M 6G is above application app's memory limit of 4G"):
        merge(job(mem_limit=6 * GiB), profile(mem_limit=4 * GiB), queue)
    with pytest.raises(SpecError, match="memory limit of 16G is above queue q's ceiling of 8G"):
        merge(job(), profile(mem_limit=16 * GiB), queue)


TASKS_TABLE = [
    # (what, profile range (min, max, default), job -n, queue max_tasks, effective (min, max), origin)
    ("nothing: one task", (None, None, None), None, None, (1, 1), DEFAULT),
    ("the profile's default", (2, 8, 4), None, None, (4, 4), PROFILE),
    ("the profile's minimum without a default", (2, 8, None), None, None, (2, 2), PROFILE),
    ("the job's count in the range", (2, 8, 4), (3, None), None, (3, 3), JOB),
    ("the job's range in the range", (2, 8, 4), (2, 8), None, (2, 8), JOB),
    ("a range cut to the queue's max_tasks", (None, None, None), (2, 8), 6, (2, 6), QUEUE),
]


@pytest.mark.parametrize("what, prange, tasks, max_tasks, expected, origin", TASKS_TABLE,
                         ids=[row[0] for row in TASKS_TABLE])
def test_task_ranges(what, prange, tasks, max_tasks, expected, origin):
    low, high, default = prange
    spec = job(slots=tasks[0], max_slots=tasks[1]) if tasks else job()
    eff = merge(spec, profile(min_tasks=low, max_tasks=high, default_tasks=default),
                QueueLimits("q", max_tasks=max_tasks))
    assert ((eff.min_tasks, eff.max_tasks), eff.origins["tasks"]) == (expected, origin)


@pytest.mark.parametrize("prange, tasks, max_tasks, message", [
    ((2, 8, None), (1, None), None, "-n 1: application app runs jobs of 2 to 8 tasks"),
    ((2, 8, None), (2, 10), None, "-n 2,10: application app runs jobs of 2 to 8 tasks"),
    ((16, None, None), None, 8, "-n 16: queue q runs jobs of at most 8 tasks"),
])
def test_task_counts_outside_the_range_are_refused(prange, tasks, max_tasks, message):
    low, high, default = prange
    spec = job(slots=tasks[0], max_slots=tasks[1]) if tasks else job()
    with pytest.raises(SpecError, match=message):
        merge(spec, profile(min_tasks=low, max_tasks=high, default_tasks=default),
              QueueLimits("q", max_tasks=max_tasks))


# ---- params, annotations, env, kind, origins ---------------------------------------------------------


def test_params_defaults_and_the_jobs_own_values():
    prof = profile(params=(Param("SOLVER", "direct"), Param("THREADS", "2"), Param("SEED")))
    eff = merge(job(exdata={"app_params": {"THREADS": "8"}}), prof, QUEUE_ANY)
    assert dict(eff.params) == {"SOLVER": "direct", "THREADS": "8"}  # SEED: no default, not given
    assert (eff.origins["param:SOLVER"], eff.origins["param:THREADS"]) == (PROFILE, JOB)
    assert eff.exported_env() == {"XCE_APP_PARAM_SOLVER": "direct", "XCE_APP_PARAM_THREADS": "8"}


def test_undeclared_params_are_refused():
    with pytest.raises(SpecError, match="declares no such param .it declares: SOLVER"):
        merge(job(exdata={"app_params": {"SOVLER": "x"}}), profile(params=(Param("SOLVER"),)), QUEUE_ANY)
    with pytest.raises(SpecError, match="has no application profile, so no params"):
        merge(job(app="", exdata={"app_params": {"X": "1"}}), None, QUEUE_ANY)


def test_annotation_names_become_environment_names():
    assert annotation_env_name("team.owner") == "XCE_APP_ANN_TEAM_OWNER"
    assert annotation_env_name("com.example/tool-version") == "XCE_APP_ANN_COM_EXAMPLE_TOOL_VERSION"
    eff = merge(job(), profile(annotations=FrozenMap({"team.owner": "imaging"})), QUEUE_ANY)
    assert eff.exported_env() == {"XCE_APP_ANN_TEAM_OWNER": "imaging"}


def test_the_jobs_env_goes_on_top_of_the_profiles_and_inherited_app_names_are_dropped():
    eff = merge(job(), profile(env=FrozenMap({"A": "profile", "B": "profile"}), params=(Param("P", "1"),)), QUEUE_ANY)
    env = eff.job_environment({"B": "job", "XCE_APP_PARAM_OLD": "from a parent job", "XCE_APP_ANN_X": "old"})
    assert env == {"A": "profile", "B": "job", "XCE_APP_PARAM_P": "1"}
    assert dict(eff.profile_env) == {"A": "profile", "B": "profile"}  # the outer layer stays clean


def test_a_service_profile_is_refused_for_batch_jobs():
    with pytest.raises(SpecError, match="application svc is a service profile; batch jobs cannot use it"):
        merge(job(), profile("svc", kind="service"), QUEUE_ANY)


def test_fields_a_preset_set_say_preset():
    spec = job("rusage[mem=1G]", run_limit=60.0, exdata={"meta": {"preset": {"name": "p", "fields": ["resreq"]}}})
    eff = merge(spec, profile(), QUEUE_ANY)
    assert (eff.origins["rusage:mem"], eff.origins["run_limit"]) == (PRESET, JOB)


def test_profile_hash_is_canonical_and_leaves_the_description_out():
    a = profile(rusage=["mem=2G"], description="one text", params=(Param("P", "1", "about P"),))
    b = profile(rusage=["mem=2048"], description="another", params=(Param("P", "1", "other words"),))
    assert a.hash == b.hash
    assert profile(rusage=["mem=3G"]).hash != a.hash
    assert profile(hooks=FrozenMap({"pre_job_exec": Hook(("/bin/check",))})).hash != profile().hash


def test_effective_values_survive_their_json_and_show_every_field_with_its_origin():
    prof = profile(select="avx512", rusage=["mem=2G"], span="ptile=2", run_limit=600.0, job_starter=("nice",),
                   env=FrozenMap({"A": "1"}), hooks=FrozenMap({"post_job_exec": Hook(("/bin/tidy",), 30.0)}))
    eff = merge(job("rusage[lic=1/job]", slots=2, max_slots=4), prof, QueueLimits("q", mem_limit=GiB))
    assert Effective.from_json(eff.to_json()) == eff
    rows = {field: (value, origin) for field, value, origin in describe(eff)}
    assert rows["tasks"] == ("2,4", JOB)
    assert rows["select"] == ("avx512", PROFILE)
    assert rows["rusage mem"] == ("2G/task", PROFILE) and rows["rusage lic"] == ("1/job", JOB)
    assert rows["run limit"] == ("0:10:00", PROFILE) and rows["memory limit"] == ("1G", QUEUE)
    assert rows["hook post_job_exec"] == ("/bin/tidy  (timeout 0:00:30)", PROFILE)
    assert rows["job starter"] == ("nice", PROFILE) and rows["post hook failure"] == ("record", PROFILE)
    assert changed_fields(eff, merge(job("rusage[lic=2/job]", slots=2, max_slots=4), prof,
                                     QueueLimits("q", mem_limit=GiB))) == ["rusage lic"]


def test_a_jobs_own_hooks_are_the_inner_layer_unless_its_profile_refuses_them():
    spec = job(exdata={"hooks": {"pre_exec": "stage in", "post_exec": "stage out"}})
    eff = merge(spec, profile(post_failure="exit"), QUEUE_ANY)
    assert dict(eff.job_hooks) == {"pre_job_exec": Hook(("/bin/sh", "-c", "stage in")),
                                   "post_job_exec": Hook(("/bin/sh", "-c", "stage out"))}
    assert eff.post_failure == "exit" and eff.origins["job_hooks"] == JOB
    assert Effective.from_json(eff.to_json()) == eff
    rows = {field: (value, origin) for field, value, origin in describe(eff)}
    assert rows["job hook pre_job_exec"] == ("stage in", JOB)
    assert merge(spec, None, QUEUE_ANY).job_hooks == eff.job_hooks  # no profile: nothing refuses them
    with pytest.raises(SpecError, match="application app does not allow a job's own hooks"):
        merge(spec, profile(job_hooks=False), QUEUE_ANY)


def test_effective_values_stored_before_the_hooks_still_load():
    stored = merge(job(), profile(), QUEUE_ANY).to_json()
    del stored["job_hooks"], stored["post_failure"]
    eff = Effective.from_json(stored)
    assert (dict(eff.job_hooks), eff.post_failure) == ({}, "record")


# ---- the property: a profile value is never removed ---------------------------------------------------

SELECTS = ["avx512", "mem>4G", "type==X86_64", "!defined(gpu)"]
JOB_RUSAGE = ["mem=1G", "mem=0", "mem=1G/host", "lic=1/job", "lic=0/job", "lic=2", "scratch=5G/host",
              "scratch=0/host", "tmp=1G"]


@st.composite
def profiles(draw) -> Profile:
    rusage = draw(st.lists(st.sampled_from(["mem=2G", "mem=2G/host", "lic=1/job", "scratch/host", "scratch=1G/host"]),
                           unique_by=lambda t: t.partition("=")[0].partition("/")[0], max_size=3))
    low = draw(st.none() | st.integers(1, 4))
    high = draw(st.none() | st.integers(low or 1, 8))
    return profile(
        select=draw(st.none() | st.sampled_from(SELECTS)), rusage=rusage,
        span=draw(st.none() | st.sampled_from(["ptile=2", "hosts=1"])),
        same=draw(st.lists(st.sampled_from(["model", "type"]), unique=True)),
        order=draw(st.none() | st.sampled_from(["-mem", "slots", "-mem:slots"])),
        run_limit=draw(st.none() | st.sampled_from([600.0, 3600.0])), mem_limit=draw(st.none() | st.just(4 * GiB)),
        min_tasks=low, max_tasks=high, env=FrozenMap(draw(st.dictionaries(st.sampled_from("AB"), st.just("v")))),
        params=(Param("P", draw(st.none() | st.just("1"))),))


@st.composite
def jobs(draw) -> JobSpec:
    parts = []
    rusage = draw(st.lists(st.sampled_from(JOB_RUSAGE), unique_by=lambda t: t.partition("=")[0], max_size=3))
    if rusage:
        parts.append("rusage[" + ", ".join(rusage) + "]")
    for section, choices in (("select", SELECTS), ("span", ["ptile=2", "ptile=4", "hosts=1"]),
                             ("same", ["model", "type"]), ("order", ["mem", "-mem", "-slots"])):
        if draw(st.booleans()):
            parts.append(f"{section}[{draw(st.sampled_from(choices))}]")
    slots = draw(st.none() | st.integers(1, 8))
    return job(" ".join(parts), slots=slots, run_limit=draw(st.none() | st.sampled_from([60.0, 7200.0])),
               mem_limit=draw(st.none() | st.sampled_from([GiB, 8 * GiB])),
               exdata={"app_params": {"P": "2"}} if draw(st.booleans()) else {})


def _conjuncts(expr) -> set:
    return set(expr.items) if isinstance(expr, rr.And) else {expr}


@settings(max_examples=400, deadline=None)
@given(profiles(), jobs())
def test_the_merge_never_removes_a_profile_value(prof, spec):
    try:
        eff = merge(spec, prof, QUEUE_ANY)
    except SpecError:
        return  # refused with a reason: nothing removed either
    r, p = eff.resreq, prof.resources
    if p.select is not None:
        assert _conjuncts(p.select) <= _conjuncts(r.select)
    if p.span is not None:
        assert r.span == p.span
    assert set(p.same) <= set(r.same)
    assert r.order[: len(p.order)] == p.order
    own = {t.name: t for t in rr.parse(spec.resreq[0]).rusage} if spec.resreq[0] else {}
    kept = {t.name: t for t in r.rusage}
    for entry in p.rusage:
        if entry.name in own:  # the job's term wins whole, keeping the profile's unit of account
            assert own[entry.name].per == entry.per
            assert kept.get(entry.name) == (own[entry.name] if own[entry.name].amount else None)
        else:
            assert kept[entry.name] == entry.default
    for mine, theirs in ((eff.run_limit, prof.run_limit), (eff.mem_limit, prof.mem_limit)):
        assert theirs is None or (mine is not None and mine <= theirs)
    assert (prof.min_tasks or 1) <= eff.min_tasks <= eff.max_tasks <= (prof.max_tasks or eff.max_tasks)
    assert eff.profile_env == prof.env
    assert "P" in eff.params or prof.params[0].default is None
