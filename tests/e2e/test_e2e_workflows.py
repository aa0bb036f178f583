"""End to end through the real controller: dependencies (every condition, and how a failure
propagates), job arrays (throttle, %I, XCE_ARRAY_INDEX, acting on one element or all), retries
and `xce requeue`."""

from __future__ import annotations

import itertools
import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, running_cluster
from tests.support.procs import zombie
from tests.support.waiting import wait_until

FOUR_SLOTS = """\
    cluster: w{pid}
    hosts:
      - {{name: local, slots: 4, mem: 1G}}
    queues:
      - {{name: normal, default: true}}
    controller: {{tick: 1s, grace: 1s}}
    """


@pytest.fixture
def wcluster():
    with running_cluster(config=FOUR_SLOTS.format(pid=os.getpid())) as c:
        yield c


def listing(c: Cluster, *refs: str, every: bool = False, elements: bool = False) -> dict:
    args = ["jobs", "--json", *(["-a"] if every else []), *(["--elements"] if elements else []), *refs]
    return json.loads(c.ok(*args))


def state(c: Cluster, ref: str) -> str:
    return listing(c, ref)["jobs"][0]["state"]


def wait_states(c: Cluster, expected: dict[str, str], timeout: float = 60) -> dict[str, dict]:
    found: dict[str, dict] = {}

    def reached() -> bool:
        for ref in expected:
            found[ref] = listing(c, ref)["jobs"][0]
        return all(found[ref]["state"] == want for ref, want in expected.items())

    wait_until(reached, timeout, f"states {expected} (last: { {r: j['state'] for r, j in found.items()} })")
    return found


# ---- dependencies ----------------------------------------------------------------------------------


def test_each_condition_releases_its_dependant_when_it_holds(wcluster: Cluster):
    c = wcluster
    gate = c.work / "go"
    first = c.submit("sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done", options=("-J", "first"))
    fails = c.submit("sh", "-c", "exit 3", options=("-J", "fails"))
    started = c.submit("true", options=("-w", "started(first)"))
    done = c.submit("true", options=("-w", "done(first)"))
    ended = c.submit("true", options=("-w", "ended(fails) && ended(first)"))
    exit3 = c.submit("true", options=("-w", f"exit({fails}, 3)"))
    exit_any = c.submit("true", options=("-w", "exit(fails, != 0) && !exit(first)"))
    slurm = c.submit("true", options=("-w", f"afterok:{first},afternotok:{fails}"))
    # started(first) and !exit(first) hold while first still runs; the others wait for it to end
    wait_states(c, {str(started): "DONE", str(exit3): "DONE", str(exit_any): "DONE"})
    assert {state(c, str(j)) for j in (done, ended, slurm)} == {"PEND"}
    assert state(c, str(first)) == "RUN"
    gate.touch()
    jobs = wait_states(c, {str(j): "DONE" for j in (first, done, ended, slurm)})
    assert jobs[str(done)]["start_time"] >= jobs[str(first)]["end_time"]


def test_a_failure_cancels_its_dependants_in_a_cascade_or_leaves_them_pending_if_asked(wcluster: Cluster):
    c = wcluster
    broken = c.submit("sh", "-c", "exit 1", options=("-J", "broken"))
    child = c.submit("true", options=("-J", "child", "-w", "done(broken)"))
    grandchild = c.submit("true", options=("-J", "grandchild", "-w", "done(child)"))
    patient = c.submit("true", options=("-J", "patient", "-w", "done(broken)", "--on-dep-fail", "pend"))
    either = c.submit("true", options=("-w", "done(broken) || ended(broken)"))
    jobs = wait_states(c, {str(child): "EXIT", str(grandchild): "EXIT", str(either): "DONE"})
    assert jobs[str(child)]["reason"] == (f"dependency can never be satisfied: done(broken): broken (job {broken}) "
                                          f"is EXIT (exit code 1) (can never hold)")
    assert jobs[str(grandchild)]["reason"].startswith("dependency can never be satisfied: done(child): child (job")
    assert jobs[str(child)]["start_time"] is None
    pending = c.ok("jobs", "-p")
    assert f"{patient}  " in pending and "its dependency can never be satisfied: done(broken)" in pending
    assert state(c, str(patient)) == "PEND"
    assert "can never be satisfied" in c.ok("why", str(patient))
    assert c.xce("kill", str(patient)).returncode == 0
    assert c.xce("wait", str(patient)).returncode == 1


def test_jobs_p_shows_unmet_dependencies_by_name_and_state(wcluster: Cluster):
    c = wcluster
    held = c.submit("true", options=("-J", "held-one", "--hold"))
    sims = int(c.ok("submit", "--parsable", "-J", "sims[1-3]", "--hold", "--", "true").strip())
    waiter = c.submit("true", options=("-J", "waiter", "-w", "done(held-one) && numdone(sims, >= 2)"))

    def shown() -> str:
        out = c.ok("jobs", "-p")
        return out if "waiting for its dependency" in out else ""

    out = wait_until(shown, 20, "the dependant's reason")
    assert (f"waiting for its dependency: done(held-one): held-one (job {held}) is PSUSP; "
            f"numdone(sims, >= 2): sims (array {sims}) has 3 PSUSP of 3") in out
    assert f"{waiter}  " in out
    c.ok("release", str(held), str(sims))
    assert c.xce("wait", str(waiter)).returncode == 0


def test_malformed_or_unresolvable_dependencies_are_refused_and_nothing_is_stored(wcluster: Cluster):
    c = wcluster
    one = c.submit("true", options=("-J", "one"))
    arr = int(c.ok("submit", "--parsable", "-J", "arr[1-2]", "--", "true").strip())
    for expr, words in [
        ("done(1) &&", "-w at position 11: expected a condition"),
        ("done(1", "position 7: expected ')'"),
        ("done(999)", "there is no job 999"),
        ("done(nobody-has-this)", "you have no job named 'nobody-has-this'"),
        ("done(nothing*)", "you have no job named 'nothing*'"),
        (f"done({one}[1])", f"job {one} is not an array"),
        (f"done({arr}[5])", f"array {arr} has no element 5"),
        ("numdone(arr, 3)", "expected a comparison"),
    ]:
        result = c.xce("submit", "-w", expr, "--", "true")
        assert result.returncode == 2, (expr, result.stderr)
        assert words in result.stderr, (expr, result.stderr)
    assert [j["id"] for j in listing(c, every=True)["jobs"]] == [one]  # the array shows as an array
    assert [a["id"] for a in listing(c, every=True)["arrays"]] == [arr]


def test_a_dependency_on_another_users_job_by_id_is_allowed_and_names_stay_the_users_own(wcluster: Cluster):
    c = wcluster
    mine = c.submit("true", options=("-J", "shared-step"))
    assert c.xce("wait", str(mine)).returncode == 0
    # let a second user in: the home and its socket open to all
    for path in (c.root, c.home, c.work):
        path.chmod(0o755)
    (c.home / "xce.sock").chmod(0o666)
    spec = {"argv": ["true"], "cwd": str(c.work)}
    by_name = as_user("nobody", c.home / "xce.sock", {"jobs": [dict(spec, depend="done(shared-step)")]})
    assert "you have no job named 'shared-step'" in by_name["error"]
    by_id = as_user("nobody", c.home / "xce.sock", {"jobs": [dict(spec, depend=f"done({mine})")]})
    theirs = by_id["ids"][0]
    assert c.xce("wait", str(theirs)).returncode == 0
    assert listing(c, str(theirs))["jobs"][0]["user"] == "nobody"


def as_user(name: str, socket_path: Path, body: dict) -> dict:
    """POST /jobs as another user: a forked child that drops to that user's uid (the controller
    tells callers apart by the socket's peer credentials). Its reply, or {"error": message}."""
    import pwd

    from xce_lite import errors
    from xce_lite.api.client import Client

    entry = pwd.getpwnam(name)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, only the request
        code = 0
        try:
            os.close(read)
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            try:
                reply = Client(socket_path).post("/jobs", body)
            except errors.XceError as err:
                reply = {"error": str(err)}
            os.write(write, json.dumps(reply).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return json.loads(data)


# ---- arrays ------------------------------------------------------------------------------------------


def test_an_array_runs_each_element_with_its_index_and_never_more_than_its_throttle(wcluster: Cluster):
    c = wcluster
    running = c.work / "running"
    running.mkdir()
    script = c.work / "element.sh"
    script.write_text(textwrap.dedent(f"""\
        touch {running}/$XCE_ARRAY_INDEX
        ls {running} | wc -l > {c.work}/seen-$XCE_ARRAY_INDEX
        sleep 0.3
        rm {running}/$XCE_ARRAY_INDEX
        echo "index $XCE_ARRAY_INDEX of array $XCE_ARRAY_ID, job $XCE_JOBID"
        """))
    out = c.ok("submit", "-J", "sweep[1-9:2,20]%2", "-o", "out-%J-%I.txt", "--", "sh", str(script))
    array_id = int(out.split("<")[1].split(">")[0])
    assert "an array of 6 elements" in out
    summary = listing(c, str(array_id))["arrays"][0]
    assert (summary["name"], summary["indices"], summary["size"]) == ("sweep", "[1,3,5,7,9,20]%2", 6)
    assert c.xce("wait", str(array_id)).returncode == 0
    indices = [1, 3, 5, 7, 9, 20]
    for k, index in enumerate(indices):
        text = (c.work / f"out-{array_id}-{index}.txt").read_text()
        assert text == f"index {index} of array {array_id}, job {array_id + k}\n"
        assert int((c.work / f"seen-{index}").read_text()) <= 2
    elements = listing(c, str(array_id), elements=True)["jobs"]
    assert [(e["display_id"], e["state"]) for e in elements] == [(f"{array_id}[{i}]", "DONE") for i in indices]
    # elements went in index order
    starts = [e["start_time"] for e in elements]
    assert starts == sorted(starts)
    table = c.ok("jobs", "-a")
    assert f"{array_id}[1,3,5,7,9,20]" in table and "6 DONE" in table and "sweep[1,3,5,7,9,20]" in table
    assert f"{array_id}[20]" in c.ok("jobs", "-a", "--elements")


def test_one_element_or_the_whole_array_is_killed_held_and_released(wcluster: Cluster):
    c = wcluster
    array_id = int(c.ok("submit", "--parsable", "-J", "many[1-5]", "--hold", "--", "true").strip())
    after_three = c.submit("true", options=("-w", f"done({array_id}[3])"))
    c.ok("kill", f"{array_id}[2]")
    assert state(c, f"{array_id}[2]") == "EXIT"
    released = c.ok("release", f"{array_id}[3]")
    assert f"Job <{array_id}[3]> is released" in released
    assert c.xce("wait", f"{array_id}[3]", str(after_three)).returncode == 0
    assert {state(c, f"{array_id}[{i}]") for i in (1, 4, 5)} == {"PSUSP"}
    assert "3 element(s) released" in c.ok("release", str(array_id))
    waited = c.xce("wait", str(array_id))
    assert waited.returncode == 1 and f"Job <{array_id}[2]> EXIT" in waited.stdout  # the killed one
    assert listing(c, str(array_id))["arrays"][0]["states"] == {"DONE": 4, "EXIT": 1}
    held = int(c.ok("submit", "--parsable", "-J", "more[1-3]", "--hold", "--", "true").strip())
    assert "3 element(s) being terminated" in c.ok("kill", str(held))
    assert c.xce("kill", f"{held}[9]").returncode == 2


@pytest.mark.parametrize("name, words", [
    ("a[]", "has no index"),
    ("a[10-1]", "ends before it starts; write 1-10"),
    ("a[1-10001]", "more than 10000 elements"),
    ("a[1-5]%0", "throttle %0 must be a whole number of at least 1"),
    ("a[0-3]", "indices run from 1"),
])
def test_bad_arrays_are_refused_with_what_to_fix(idle_cluster: Cluster, name: str, words: str):
    result = idle_cluster.xce("submit", "-J", name, "--", "true")  # refused by the client, before any request
    assert result.returncode == 2 and words in result.stderr, result.stderr


# ---- retries and requeue ------------------------------------------------------------------------------


def test_a_failed_attempt_is_retried_with_its_attempt_number_and_each_attempt_is_in_the_history(wcluster: Cluster):
    c = wcluster
    flaky = c.submit("sh", "-c", 'echo "attempt $XCE_ATTEMPT"; test "$XCE_ATTEMPT" -ge 3', options=("--retry", "3"))
    wrong_code = c.submit("sh", "-c", "exit 4", options=("--retry", "2", "--retry-on", "1,3"))
    right_code = c.submit("sh", "-c", 'exit $((XCE_ATTEMPT + 2))', options=("--retry", "1", "--retry-on", "3"))
    assert c.xce("wait", str(flaky)).returncode == 0
    job = listing(c, str(flaky))["jobs"][0]
    assert (job["state"], job["attempt"], job["retries"], job["submit_time"]) == ("DONE", 3, 2, job["submit_time"])
    assert (c.work / f"xce-{flaky}.out").read_text() == "attempt 1\nattempt 2\nattempt 3\n"
    history = [e for e in json.loads(c.ok("jobs", "--json", "-l", str(flaky)))["jobs"][0]["history"]
               if e["kind"] in ("dispatched", "requeued", "finished")]
    assert [(e["kind"], (e["data"].get("attempt") or e["data"].get("result", {}).get("attempt"))) for e in history] \
        == [("dispatched", 1), ("requeued", 1), ("dispatched", 2), ("requeued", 2), ("dispatched", 3),
            ("finished", None)]
    assert history[1]["data"]["reason"] == "attempt 1 failed (exit code 1); retry 1 of 3"
    assert history[1]["data"]["result"]["exit_code"] == 1
    assert "requeued: attempt 2 failed (exit code 1); retry 2 of 3" in c.ok("jobs", "-l", str(flaky))
    assert c.xce("wait", str(wrong_code), str(right_code)).returncode == 1
    assert listing(c, str(wrong_code))["jobs"][0]["retries"] == 0  # 4 is not a code to retry on
    job = listing(c, str(right_code))["jobs"][0]
    assert (job["retries"], job["exit_code"]) == (1, 4)  # retried on 3, then ended with 4


def test_a_killed_job_is_not_retried(wcluster: Cluster):
    c = wcluster
    job_id = c.submit("sleep", "60", options=("--retry", "3"))
    c.wait_state(job_id, {"RUN"})
    c.ok("kill", str(job_id))
    assert c.xce("wait", str(job_id)).returncode == 1
    assert listing(c, str(job_id))["jobs"][0]["retries"] == 0


def test_the_profile_sets_retries_and_a_job_may_ask_for_fewer(idle_cluster: Cluster):
    c = idle_cluster
    (c.home / "applications.yaml").write_text("applications:\n  flaky:\n    retry: {count: 1, exit_codes: [5]}\n")
    c.start()
    job_id = c.submit("sh", "-c", "exit 5", options=("-app", "flaky"))
    assert c.xce("wait", str(job_id)).returncode == 1
    job = listing(c, str(job_id))["jobs"][0]
    assert (job["attempt"], job["retries"]) == (2, 1)
    too_many = c.xce("submit", "-app", "flaky", "--retry", "3", "--", "true")
    assert too_many.returncode == 2 and "--retry 3 is above application flaky's 1 retries" in too_many.stderr
    assert "retries       1 on 5" in c.ok("jobs", "-l", str(job_id))


def test_requeue_stops_a_running_job_and_runs_it_again_under_the_same_id(wcluster: Cluster):
    c = wcluster
    pids = c.work / "pids"
    job_id = c.submit("sh", "-c", f'echo $$ >> {pids}; echo "attempt $XCE_ATTEMPT"; sleep 60')
    first = c.wait_state(job_id, {"RUN"})
    wait_until(lambda: pids.exists() and pids.read_text().strip(), 10, "the first attempt's pid")
    first_pid = int(pids.read_text().split()[0])
    assert "is being requeued" in c.ok("requeue", str(job_id))
    again = wait_until(lambda: (j := listing(c, str(job_id))["jobs"][0])["attempt"] == 2 and j["state"] == "RUN"
                       and j, 30, "the second attempt to run")
    assert again["submit_time"] == first["submit_time"]
    wait_until(lambda: not Path(f"/proc/{first_pid}").exists() or zombie(first_pid), 20, "the first attempt to stop")
    assert c.xce("requeue", "--hold", str(job_id)).returncode == 0
    c.wait_state(job_id, {"PSUSP"})
    refused = c.xce("requeue", str(job_id))
    assert refused.returncode == 1 and "only a dispatched or running job is requeued" in refused.stderr
    c.ok("kill", str(job_id))


def test_dependencies_and_throttles_survive_a_controller_kill_9(wcluster: Cluster):
    c = wcluster
    gate = c.work / "gate"
    first = c.submit("sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done", options=("-J", "first"))
    array_id = int(c.ok("submit", "--parsable", "-J", "later[1-4]%1", "-w", "done(first)", "--", "true").strip())
    last = c.submit("true", options=("-w", f"numdone({array_id}, == *)"))
    c.wait_state(first, {"RUN"})
    c.kill9_controller()
    gate.touch()
    c.start()
    assert c.xce("wait", str(first), str(array_id), str(last)).returncode == 0
    elements = listing(c, str(array_id), elements=True)["jobs"]
    spans = sorted((e["start_time"], e["end_time"]) for e in elements)
    assert all(a_end <= b_start for (_a, a_end), (b_start, _b) in itertools.pairwise(spans))  # %1: one at a time
