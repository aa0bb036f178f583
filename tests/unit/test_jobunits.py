"""jobunits.py: a job's units, what each host is asked to run, and matching a host's list of units.

Pure tables: no processes. The end-to-end behaviour (units on real hosts) is in the e2e tests.
"""

from __future__ import annotations

import pytest

from xce_lite.config.merge import merge
from xce_lite.config.merge_values import Hook, Profile, QueueLimits
from xce_lite.controller.jobunits import Expected, hostfile, job_units, launch_requests, parse_unit, reconcile
from xce_lite.exec.host import HookRun, JobResult, UnitInfo
from xce_lite.models import Job, JobSpec, unit_name
from xce_lite.sched.reasons import FrozenMap

RESULT = JobResult(exit_code=0, signal=None, start_time=1.0, end_time=2.0, cpu_time=0.1, max_rss=1024)


def job(hosts=(("h1", 2), ("h2", 2)), gpus=((), ()), env=None) -> Job:
    allocs = [[h, n, {"slots": n}, list(g)] for (h, n), g in zip(hosts, gpus)]
    return Job(id=7, user="alice", queue="normal", state="DISP", submit_time=0.0, attempt=2,
               spec=JobSpec(argv=("mpirun", "./sim"), cwd="/work", name="sim", env=env or {"A": "1"}),
               hosts=tuple(hosts), unit=unit_name("lab", 7, 2, 0), alloc={"allocs": allocs, "shared": {}})


def test_units_are_named_per_attempt_and_host_and_parse_back() -> None:
    assert job_units("lab", 7, 2, 3) == ("xce-lab-7-2-0", "xce-lab-7-2-1", "xce-lab-7-2-2")
    assert parse_unit("lab", "xce-lab-7-2-1") == (7, 2, 1)
    assert parse_unit("lab", "xce-other-7-2-1") is None  # another cluster's unit is never ours
    assert parse_unit("lab", "xce-lab-7-2-1.service") is None


def test_the_hostfile_names_hosts_as_the_controller_reaches_them() -> None:
    text = hostfile([("h1", 2), ("h2", 3)], {"h2": "10.0.0.2"})
    assert text == "h1 slots=2\n10.0.0.2 slots=3\n"


def test_each_host_gets_its_own_unit_with_its_share_of_the_tasks() -> None:
    launches = launch_requests("lab", job(gpus=((0, 1), ())), grace=5.0, run_limit=60.0, mem_limit=None,
                               addresses={})
    assert [(u.host, u.index, u.request.unit, u.request.role) for u in launches] == [
        ("h1", 0, "xce-lab-7-2-0", "job"), ("h2", 1, "xce-lab-7-2-1", "host")]
    first, second = (u.request for u in launches)
    assert first.argv == ("mpirun", "./sim") and second.argv == ()  # only the first host runs the command
    for request in (first, second):
        assert (request.run_limit, request.grace, request.cwd) == (60.0, 5.0, "/work")
        assert request.hostfile == "h1 slots=2\nh2 slots=2\n"
        assert request.env["A"] == "1"
        assert {k: request.env[k] for k in ("XCE_JOBID", "XCE_SLOTS", "XCE_HOSTS", "XCE_ATTEMPT")} == {
            "XCE_JOBID": "7", "XCE_SLOTS": "4", "XCE_HOSTS": "h1 h2", "XCE_ATTEMPT": "2"}
    assert (first.env["XCE_HOST_NTASKS"], first.env["XCE_HOST_TASK_INDEX"]) == ("2", "0")
    assert (second.env["XCE_HOST_NTASKS"], second.env["XCE_HOST_TASK_INDEX"]) == ("2", "2")
    assert first.env["CUDA_VISIBLE_DEVICES"] == "0,1" and "CUDA_VISIBLE_DEVICES" not in second.env


def test_each_unit_gets_its_hooks_in_order_and_the_job_ones_only_on_the_first_host() -> None:
    hooks = FrozenMap({point: Hook((f"/bin/{point}",), 30.0 if point == "pre_host_exec" else None)
                       for point in ("pre_host_exec", "pre_job_exec", "post_job_exec", "post_host_exec")})
    prof = Profile("app", hooks=hooks, post_failure="exit", env=FrozenMap({"P": "1"}), job_starter=("nice",))
    row = job()
    spec = JobSpec(argv=row.spec.argv, cwd="/work", app="app", exdata={"hooks": {"pre_exec": "a", "post_exec": "b"}})
    eff = merge(spec, prof, QueueLimits("normal"))
    row = Job(**{**row.__dict__, "spec": spec, "effective": eff.to_json()})
    first, second = (u.request for u in launch_requests("lab", row, 5.0, None, None, {}))
    own = {"pre_job_exec": ("/bin/sh", "-c", "a"), "post_job_exec": ("/bin/sh", "-c", "b")}
    assert [(h.point, h.layer, h.argv, h.timeout) for h in first.hooks] == [
        ("pre_host_exec", "profile", ("/bin/pre_host_exec",), 30.0),
        ("pre_job_exec", "profile", ("/bin/pre_job_exec",), 300.0),
        ("pre_job_exec", "job", own["pre_job_exec"], 300.0),
        ("post_job_exec", "job", own["post_job_exec"], 300.0),
        ("post_job_exec", "profile", ("/bin/post_job_exec",), 300.0),
        ("post_host_exec", "profile", ("/bin/post_host_exec",), 300.0)]
    assert second.hooks == (HookRun("pre_host_exec", "profile", ("/bin/pre_host_exec",), 30.0),
                            HookRun("post_host_exec", "profile", ("/bin/post_host_exec",), 300.0))
    for request in (first, second):
        assert (request.post_failure, request.profile_env, request.starter) == ("exit", {"P": "1"}, ("nice",))
    assert first.argv == ("nice", "mpirun", "./sim")


def test_post_hooks_that_failed_are_noted_after_the_reason_and_a_done_job_stays_done() -> None:
    from types import SimpleNamespace

    from xce_lite.controller.jobunits import failed_pre_hook
    from xce_lite.controller.outcomes import finish_from_result as _finish_from_result

    running = SimpleNamespace(id=7, state="RUN", killed=None)
    post = {"point": "post_job_exec", "layer": "profile", "ok": False}
    noted = JobResult(0, None, 1.0, 2.0, 0.1, 1024, note="post_job_exec hook (profile) exited 2", hooks=(post,))
    finish = _finish_from_result(running, noted)
    assert (finish.state, finish.reason, finish.hooks) == ("DONE", "post_job_exec hook (profile) exited 2", (post,))
    killed = JobResult(None, 15, 1.0, 2.0, 0.1, 1024, reason="killed by alice", note=noted.note)
    assert _finish_from_result(running, killed).reason == "killed by alice; post_job_exec hook (profile) exited 2"
    # killed, and the kill delivered: its result words it so; not delivered (the host stopped it
    # when the lease ran out first, or it failed): the kill's reason first, then how it ended
    marked = SimpleNamespace(id=7, state="RUN", killed="killed by alice")
    assert _finish_from_result(marked, killed).reason == "killed by alice; post_job_exec hook (profile) exited 2"
    expired = JobResult(0, None, 1.0, 2.0, 0.1, 1024, reason="lease expired: no word from the controller")
    assert (_finish_from_result(marked, expired).state, _finish_from_result(marked, expired).reason) == \
        ("EXIT", "killed by alice (lease expired: no word from the controller, before it confirmed the kill)")
    failed = JobResult(2, None, 1.0, 2.0, 0.1, 1024)
    assert _finish_from_result(marked, failed).reason == "killed by alice (exit code 2, before it confirmed the kill)"
    assert _finish_from_result(marked, noted).state == "DONE"  # it ended well before the kill reached it
    pre = {"point": "pre_host_exec", "layer": "profile", "ok": False}
    assert failed_pre_hook(JobResult(None, None, 1.0, 2.0, 0, 0, reason="pre_host_exec hook (profile) exited 1",
                                     hooks=(pre,))) == "pre_host_exec hook (profile) exited 1"
    assert failed_pre_hook(noted) is None


def test_a_submitters_own_cuda_devices_never_reach_a_host_without_gpus() -> None:
    launches = launch_requests("lab", job(hosts=(("h1", 1),), gpus=((),), env={"CUDA_VISIBLE_DEVICES": "3"}),
                               grace=5.0, run_limit=None, mem_limit=None, addresses={})
    assert "CUDA_VISIBLE_DEVICES" not in launches[0].request.env


# ---- reconcile ----------------------------------------------------------------------------------


def listed(unit: str, status: str = "running", result: JobResult | None = None) -> UnitInfo:
    return UnitInfo(unit=unit, status=status, start_time=1.0, result=result)


@pytest.mark.parametrize("units, expected, outcome", [
    # an expected unit that runs is adopted; one that ended is recorded
    ([listed("a")], {"a": Expected(1, 0, started=False)}, {"running": [("a", 1.0)]}),
    ([listed("a", "finished", RESULT)], {"a": Expected(1, 0, started=True)}, {"finished": [("a", RESULT)]}),
    # never reached its host: launch it (the name makes that safe); ran and is gone: vanished
    ([], {"a": Expected(1, 0, started=False)}, {"to_launch": ["a"]}),
    ([], {"a": Expected(1, 0, started=True)}, {"vanished": ["a"]}),
    # nobody expects it: a running copy is stopped, an ended one forgotten
    ([listed("x")], {}, {"stale": ["x"]}),
    ([listed("x", "finished", RESULT)], {}, {"forget": ["x"]}),
    # a draining unit: still running is stopped (again); ended is recorded; not listed is gone
    ([listed("d")], {"d": Expected(1, -1, started=True, draining=True)}, {"stale": ["d"]}),
    ([listed("d", "finished", RESULT)], {"d": Expected(1, -1, started=True, draining=True)},
     {"finished": [("d", RESULT)]}),
    ([], {"d": Expected(1, -1, started=True, draining=True)}, {"gone": ["d"]}),
])
def test_reconcile_says_what_each_listed_or_missing_unit_means(units, expected, outcome) -> None:
    seen = reconcile(units, expected)
    fields = ("finished", "running", "to_launch", "vanished", "stale", "forget", "gone")
    assert {f: getattr(seen, f) for f in fields if getattr(seen, f)} == outcome
