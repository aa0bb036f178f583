"""The simulator (the controller's own tick), recordings, verify, snapshots, the trace's bounds, and
export.

Real parts: real config and workload files in tmp_path, the real controller with its store, core and
merge, the fake hosts behind the exec seam (the simulated world), and for export a real controller's
store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from tests.support import paths
from tests.support.waiting import wait_until
from xce_lite.controller.invariants import check_invariants
from xce_lite.errors import SpecError
from xce_lite.exec.fake import FakeCluster, sim_argv
from xce_lite.exec.host import LaunchRequest, UnitFinished
from xce_lite.sched import core
from xce_lite.sim import report, trace
from xce_lite.sim.ticked import START, Outcome, Step, TickSimulation
from xce_lite.sim.workload import load_workload

EXAMPLES = paths.EXAMPLES / "sim"

CONFIG = """cluster: simtest
hosts:
  - {name: a1, slots: 4, mem: 8G}
  - {name: a2, slots: 4, mem: 8G}
  - {name: b1, slots: 8, mem: 32G, tags: [big]}
queues:
  - {name: normal, priority: 30, default: true}
  - {name: fast, priority: 60, run_limit: 100s}
controller: {tick: 1s}
"""
WORKLOAD = """jobs:
  - {submit: 0, name: first, n: 4, runtime: 50}
  - {submit: 0, name: second, n: 8, R: "select[big]", runtime: 30}
  - {submit: 5, n: 6, R: "span[ptile=2]", runtime: 20}
  - {submit: 5, queue: fast, n: 2, runtime: 500}
  - {submit: 6, n: 2, R: "rusage[mem=6G]", runtime: 10, exit: 3}
  - {submit: 7, n: 2, R: "rusage[mem=6G]", runtime: 10}
  - {submit: 8, n: 1, runtime: 5, after: "done(first) && ended(second)"}
  - {submit: 9, array: "arr[1-5]%2", runtime: 7}
  - {submit: 9, n: 64, runtime: 1}
"""


def files(tmp_path: Path, config: str = CONFIG, workload: str = WORKLOAD, suffix: str = ".yaml") -> tuple[Path, Path]:
    c, w = tmp_path / "xce.yaml", tmp_path / f"workload{suffix}"
    c.write_text(config)
    w.write_text(workload)
    return c, w


def checked(sim: TickSimulation) -> None:
    check_invariants(sim.run.ctl, set())


def simulate(config: Path, workload: Path) -> tuple[dict[int, Outcome], list[Step], list[tuple[int, str]]]:
    """The whole run, the controller's invariants checked after every tick: (jobs by id, steps,
    rejected (row, why))."""
    sim = TickSimulation(config, load_workload(workload), after_tick=checked)
    try:
        steps = []
        while (step := sim.step()) is not None:
            steps.append(step)
        return {o.id: o for o in sim.outcomes()}, steps, sim.rejected
    finally:
        sim.close()


def xce_sim(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xce_lite", "sim", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_a_run_follows_the_workload_through_the_controllers_tick(tmp_path):
    jobs, steps, rejected = simulate(*files(tmp_path))
    assert [steps[0].time, [(j, hosts) for j, _attempt, hosts in steps[0].dispatched]] == [
        0.0, [(1, (("a1", 4),)), (2, (("b1", 8),))]]
    assert [(row, "needs at least 64 tasks" in why) for row, why in rejected] == [(9, True)]  # no id: refused
    assert len(jobs) == 12  # the 64-task job was never stored
    assert (jobs[4].state, jobs[4].reason, jobs[4].end - jobs[4].start) == ("EXIT", "run limit 00:01:40 reached", 100)
    assert (jobs[5].state, jobs[5].exit_code) == ("EXIT", 3)
    assert jobs[7].start >= max(jobs[1].end, jobs[2].end)  # done(first) && ended(second)
    elements = [j for j in jobs.values() if j.array_id is not None]
    assert [j.name for j in elements] == [f"arr[{i}]" for i in range(1, 6)]
    for j in elements:  # at most 2 elements run at once
        assert sum(1 for k in elements if k.start <= j.start < k.end) <= 2
    assert all(j.state in ("DONE", "EXIT") for j in jobs.values())
    waits = [r for s in steps for r in s.reasons if 6 in r[1]]
    assert waits and waits[0][0].startswith("needs at least 2 tasks, at most 1 fit; ")
    assert len({(j, a) for s in steps for j, a, _ in s.dispatched}) == sum(len(s.dispatched) for s in steps)


def test_same_inputs_give_the_same_bytes_and_verify_catches_a_changed_decision(tmp_path):
    config, workload = files(tmp_path)
    one, two = tmp_path / "one.rec", tmp_path / "two.rec"
    first = xce_sim("run", config, workload, "--output", one)
    second = xce_sim("run", config, workload, "--output", two)
    assert first.returncode == 0 and second.returncode == 0, first.stderr
    assert one.read_bytes() == two.read_bytes() and first.stdout == second.stdout
    assert "makespan:" in first.stdout and "utilisation: gpus" not in first.stdout and "slots" in first.stdout
    same = xce_sim("run", config, workload, "--verify", one)
    assert same.returncode == 0 and "verify: no difference" in same.stdout
    lines = one.read_text().splitlines()
    changed = json.loads(lines[1])
    changed["dispatched"][0][2][0][0] = "a2"  # job 1 "was" placed on a2
    lines[1] = json.dumps(changed, sort_keys=True, separators=(",", ":"))
    one.write_text("\n".join(lines) + "\n")
    caught = xce_sim("run", config, workload, "--verify", one)
    assert caught.returncode == 1
    assert "step 1 (t=0) differs in dispatched" in caught.stdout
    assert 'recorded [1,1,[["a2",4]]]' in caught.stdout and 'now      [1,1,[["a1",4]]]' in caught.stdout


def test_verify_refuses_a_recording_of_another_workload(tmp_path):
    config, workload = files(tmp_path)
    rec = tmp_path / "r.rec"
    assert xce_sim("run", config, workload, "--output", rec).returncode == 0
    workload.write_text(WORKLOAD.replace("runtime: 50", "runtime: 51"))
    result = xce_sim("run", config, workload, "--verify", rec)
    assert result.returncode == 2 and "was made with workload" in result.stderr


def test_a_snapshot_taken_midway_goes_on_exactly_as_the_whole_run(tmp_path):
    config, workload = files(tmp_path)
    whole, rest, snap = tmp_path / "whole.rec", tmp_path / "rest.rec", tmp_path / "mid.snap"
    assert xce_sim("run", config, workload, "--output", whole).returncode == 0
    half = xce_sim("run", config, workload, "--stop-at", "30", "--save", snap)
    assert half.returncode == 0 and json.loads(snap.read_text())["state"]["now"] <= 30
    resumed = xce_sim("run", config, workload, "--load", snap, "--output", rest)
    assert resumed.returncode == 0, resumed.stderr
    tail = rest.read_text().splitlines()[1:]
    assert tail and tail == whole.read_text().splitlines()[-len(tail):]
    assert json.loads(tail[0])["step"] == json.loads(snap.read_text())["state"]["step"] + 1
    assert resumed.stdout.splitlines()[1:] == xce_sim("run", config, workload).stdout.splitlines()[1:]


def test_csv_workloads_and_bad_input_say_where_and_what_to_do(tmp_path):
    config, workload = files(tmp_path, workload="submit,user,n,R,runtime\n0,ann,2,,10\n3,bob,1,rusage[mem=1G],5\n",
                             suffix=".csv")
    result = xce_sim("run", config, workload)
    assert result.returncode == 0 and "jobs: 2 DONE" in result.stdout
    workload.write_text("submit,user,n,runtime,colour\n0,ann,2,10,red\n")
    bad = xce_sim("run", config, workload)
    assert bad.returncode == 2 and "unknown column(s) colour" in bad.stderr
    for text, expected in (("jobs:\n  - {submit: 0}\n", "job 1 (line 2): `runtime` is missing"),
                           ("jobs:\n  - {submit: 0, runtime: 5, n: 'x'}\n", "`n` must be MIN or MIN,MAX"),
                           ("jobs:\n  - {submit: 0, runtime: 5, after: 'done(a) &&'}\n", "job 1 (line 2): `after`: -w"),
                           ("jobs:\n  - {submit: 0, runtime: 5, array: 'a[3-1]'}\n", "3-1 ends before it starts")):
        w = tmp_path / "bad.yaml"
        w.write_text(text)
        with pytest.raises(SpecError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            simulate(config, w)
    w = tmp_path / "later.yaml"  # a name resolves when its dependant is submitted, as in the controller
    w.write_text("jobs:\n  - {submit: 0, runtime: 5, after: 'done(later)'}\n  - {submit: 1, runtime: 5, name: later}\n")
    jobs, _steps, rejected = simulate(config, w)
    assert [row for row, _why in rejected] == [1] and "you have no job named 'later'" in rejected[0][1]
    assert [(j.name, j.state) for j in jobs.values()] == [("later", "DONE")]


def test_dependencies_and_arrays_go_through_the_controllers_gate(tmp_path):
    config, workload = files(tmp_path, workload="""jobs:
  - {submit: 0, name: prep, runtime: 10, exit: 1}
  - {submit: 0, name: main, runtime: 10, after: "done(prep)"}
  - {submit: 0, array: "sweep[1-6:2,9]%2", runtime: 4}
  - {submit: 0, name: cleanup, runtime: 1, after: "exit(prep, 1) && numended(sweep, == *)"}
  - {submit: 0, name: watch, runtime: 1, after: "started(sweep[9])"}
""")
    by_id, _steps, _rejected = simulate(config, workload)
    jobs = {j.name: j for j in by_id.values()}
    assert jobs["main"].state == "EXIT" and jobs["main"].start is None
    assert jobs["main"].reason == ("dependency can never be satisfied: done(prep): prep (job 1) is EXIT (exit code 1) "
                                   "(can never hold)")
    sweep = [j for j in by_id.values() if j.array_id is not None]
    assert [j.name for j in sweep] == ["sweep[1]", "sweep[3]", "sweep[5]", "sweep[9]"]
    assert all(j.state == "DONE" for j in sweep) and jobs["cleanup"].state == "DONE"
    assert jobs["cleanup"].start >= max(j.end for j in sweep)
    assert max(sum(1 for k in sweep if k.start <= j.start < k.end) for j in sweep) == 2
    assert jobs["watch"].start >= jobs["sweep[9]"].start


def test_fake_hosts_keep_the_seam_contract_on_the_simulated_clock():
    import queue

    cluster = FakeCluster()
    events: queue.Queue = queue.Queue()
    host = cluster.host("h")
    assert host.connect(events).extra == {"fake": True}
    req = LaunchRequest("u1", sim_argv(10, 0), {}, "/", "/dev/null", None, run_limit=5)
    assert host.launch([req])[0].status == "started"
    assert host.launch([req])[0].status == "running"  # adopted, never started twice
    assert host.launch([LaunchRequest("u2", ("sleep", "1"), {}, "/", "/dev/null", None)])[0].status == "refused"
    assert cluster.advance(4.9) == 0 and events.empty()
    assert cluster.advance(5) == 1
    done = events.get_nowait()
    assert isinstance(done, UnitFinished) and done.result.reason == "run limit 00:00:05 reached"
    assert [u.status for u in host.list_units()] == ["finished"]
    host.forget(["u1"])
    assert host.list_units() == [] and cluster.next_end() is None


def test_a_host_with_other_free_amounts_is_what_replace_would_build_and_checks_what_changes():
    from dataclasses import replace

    view = core.HostView("h", "ok", {"slots": 4, "mem": 8 << 30, "gpus": 2}, None, (0, 1), {"type": "X"},
                         frozenset({"t"}))
    free = {"slots": 1, "mem": 1 << 30, "gpus": 1}
    assert view.with_free(free, (1,), "closed") == replace(view, free=free, gpu_free=(1,), state="closed")
    for bad_free, gpu_free, state in (({"slots": 1}, (), None), ({**free, "mem": float("nan")}, (1,), None),
                                      (free, (0, 1), None), (free, (1,), "gone")):
        with pytest.raises(ValueError):
            view.with_free(bad_free, gpu_free, state)


def _big_job_examined() -> core.Examined:
    hosts = tuple(core.HostView(f"h{i:04d}", "ok" if i % 50 else "closed", {"slots": 4, "mem": 8 << 30},
                                {"slots": i % 3, "mem": (i % 5) << 30}, (), {}, frozenset({"gpu"} if i % 7 else ()))
                  for i in range(1000))
    from xce_lite.sched.placement import JobRequest
    from xce_lite.sched.resreq import parse

    job = core.PendingJob(1, "u", "normal", JobRequest(1, 64, 64, parse("select[gpu] rusage[mem=2G] span[ptile=4]")))
    seen: list[core.Examined] = []
    core.schedule(core.Snapshot(hosts, (job,), (core.QueuePolicy("normal"),)), observe=seen.append)
    return seen[0]


def test_a_1000_host_64_task_job_at_full_level_prints_exactly_the_line_bound_with_exact_counts():
    examined = _big_job_examined()
    lines = trace.render(examined, 1, 0.0, 1, trace.FULL)
    assert len(lines) == trace.FULL_LINES
    assert lines[1].startswith("  no plan: needs at least 64 tasks") and lines[2].startswith("  candidates: 1000 hosts")
    omitted = next(line for line in lines if "more hosts not shown" in line)
    refusal = examined.outcome
    shown = [line for line in lines if line.startswith("    ")]
    assert int(omitted.split()[1]) == 1000 - len(shown)
    counts = {rule: int(n) for n, rule in (part.split(" ", 1) for part in omitted.split(": ", 1)[1].split(", "))}
    assert sum(counts.values()) == 1000 - len(shown)
    rules_shown = [line.split(": ")[1].split(":")[0] if "can take" not in line else "with room" for line in shown]
    expected = {"with room": len(refusal.capacity), "closed": 20, "select false": sum(
        1 for r in refusal.hosts if isinstance(r.reasons[0], trace.SelectFalse))}
    for rule, total in expected.items():
        assert counts.get(rule, 0) + rules_shown.count(rule) == total, rule
    assert lines[-1].startswith("  pend reason: ") and len(trace.render(examined, 1, 0.0, 1, trace.SUMMARY)) == 1


def test_10000_traced_decisions_stay_under_the_memory_bound_keeping_the_newest():
    lines = trace.render(_big_job_examined(), 1, 1.0, 1, trace.FULL)
    body = "\n" + "\n".join(lines[1:])  # each decision differs in its first line; rendering is tested above
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    store = trace.TraceStore()
    for step in range(1, 10_001):
        store.add(trace.Record(step, 1, lines[0].replace("step 1 t=1 session 1", f"step {step} t={step} "
                                                         f"session {step}") + body))
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < trace.BYTE_BOUND and store.bytes < trace.BYTE_BOUND
    assert store.records[-1].step == 10_000 and store.evicted == 0 and len(store.records) == 10_000
    small = trace.TraceStore(byte_bound=50_000)
    for step in range(1, 101):
        small.add(trace.Record(step, 1, "x" * 1000))
    assert small.records[-1].step == 100 and small.evicted > 0 and small.bytes <= 50_000


def test_every_example_scenario_runs_as_written():
    scenarios = sorted(p for p in EXAMPLES.iterdir() if p.is_dir())
    assert [p.name for p in scenarios] == ["fairshare", "gpu", "lossy", "ptile", "starving"]
    for folder in scenarios:
        result = xce_sim("run", folder / "xce.yaml", folder / "workload.yaml")
        assert result.returncode == 0 and "makespan:" in result.stdout, (folder, result.stderr)
        assert "jobs: " in result.stdout and "REJECTED" not in result.stdout, (folder, result.stdout)


def test_export_turns_a_controller_history_into_a_workload_that_runs(cluster, tmp_path):
    # sleep 3: the others are submitted while it runs, however slow the launch (the export keeps no
    # launch delay), so that the high-priority job overtakes the 2-task one in the replay too
    ids = [cluster.submit("sleep", "3"), cluster.submit("sh", "-c", "exit 4", options=("-n", "2")),
           cluster.submit("true", options=("-q", "high", "-J", "quick"))]
    for job_id in ids:
        wait_until(lambda j=job_id: cluster.job(j)["state"] in ("DONE", "EXIT"), 60, f"job {job_id} to end")
    out = tmp_path / "history.yaml"
    assert "wrote 3 jobs" in cluster.ok("sim", "export", str(out))
    exported = load_workload(out).jobs
    assert [(j.queue, j.slots, j.exit_code, j.name) for j in exported] == [
        ("normal", None, 0, None), ("normal", 2, 4, None), ("high", None, 0, "quick")]
    assert exported[0].runtime >= 1 and exported[0].submit == 0
    result = xce_sim("run", cluster.home / "xce.yaml", out)
    assert result.returncode == 0 and "jobs: 2 DONE, 1 EXIT" in result.stdout, result.stdout + result.stderr
    # instants at every event, not on the tick's grid: the same jobs, in the same order, on the same hosts, same ends
    rec = tmp_path / "tick.rec"
    ticked = xce_sim("run", "--interval", "0", cluster.home / "xce.yaml", out, "--output", rec)
    assert ticked.returncode == 0 and "jobs: 2 DONE, 1 EXIT" in ticked.stdout, ticked.stdout + ticked.stderr
    steps = [json.loads(line) for line in rec.read_text().splitlines()[1:]]
    replayed = [(d[0], [h for h, _ in d[2]]) for step in steps for d in step["dispatched"]]
    real = sorted((cluster.job(j)["start_time"], j, [h[0] for h in cluster.job(j)["hosts"]]) for j in ids)
    assert replayed == [(j, hosts) for _, j, hosts in real] == [(1, ["local"]), (3, ["local"]), (2, ["local"])], (
        replayed, real, out.read_text())  # ids: the same submit order


def test_a_workload_with_many_mistakes_gets_them_all_at_once_each_with_its_job_and_line(tmp_path):
    config, workload = files(tmp_path, workload="""jobs:
  - {submit: 0, runtime: 5, n: 'x', queue: ""}
  - {runtime: -3, W: forever}
  - {submit: 1, runtime: 5, after: 'done(a) &&', colour: red}

  - {submit: 0, runtime: 5, array: 'a[3-1]', exit: 300}
""")
    result = xce_sim("run", config, workload)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    expected = ["job 1 (line 2): `n` must be MIN or MIN,MAX", "job 1 (line 2): `queue` must be a non-empty text",
                "job 2 (line 3): `submit` is missing", "job 2 (line 3): `runtime` cannot be negative",
                "job 2 (line 3): W 'forever' is not a duration", "job 3 (line 4): unknown field(s) colour",
                "job 3 (line 4): `after`: -w at position 11", "job 4 (line 6): array '[3-1]'",
                "job 4 (line 6): `exit` must be a whole number from 0 to 255"]
    for words in expected:
        assert f"workload {workload}, {words}" in result.stderr, (words, result.stderr)
    assert result.stderr.rstrip().endswith("nothing was simulated; fix the workload and run again")
    csv = tmp_path / "w.csv"
    csv.write_text("submit,runtime,n\n0,5,2\nsoon,5,0\n")
    bad = xce_sim("run", config, csv)
    assert bad.returncode == 2
    assert f"workload {csv}, job 2 (line 3): submit 'soon' is not a duration" in bad.stderr
    assert f"workload {csv}, job 2 (line 3): `n` '0'" in bad.stderr


def test_the_summary_says_why_each_rejected_job_was_rejected(tmp_path):
    config, workload = files(tmp_path)
    result = xce_sim("run", config, workload)
    assert result.returncode == 0
    assert ("  rejected: workload row 9: can never start, even on an empty cluster: needs at least 64 "
            "tasks, at most 16 fit") in result.stdout
    doc = json.loads(xce_sim("run", config, workload, "--json").stdout)
    assert doc["states"] == {"DONE": 10, "EXIT": 2, "REJECTED": 1} and doc["verify"] is None
    assert doc["rejected"] == [{"row": 9, "reason": doc["rejected"][0]["reason"]}]
    assert "needs at least 64 tasks" in doc["rejected"][0]["reason"]


@pytest.mark.parametrize("option, value, words", [
    ("--stop-at", "-5", "'--stop-at': -5.0 is not in the range x>=0"),
    ("--interval", "inf", "'--interval': inf is not in the range 0<=x<=10000000"),
    ("--output", "missing/run.rec", "the directory 'missing' does not exist"),
    ("--save", ".", "'.' is a directory; name a file in it"),
])
def test_a_run_that_could_not_go_as_asked_is_refused_before_it_runs(tmp_path, option, value, words):
    config, workload = files(tmp_path)
    result = subprocess.run([sys.executable, "-m", "xce_lite", "sim", "run", str(config), str(workload), option, value],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    first, usage, _hint = result.stderr.splitlines()
    assert first.startswith("xce: Invalid value for ") and words in first and usage.startswith("Usage: xce sim run")


def test_a_run_longer_than_keep_finished_still_sums_up_every_job(tmp_path):
    """The controller's retention (paced by real time, so it may fall at any simulated instant) would
    archive the first job long before the last ends; the simulation's store archives nothing, so the
    summary counts both, whenever retention runs."""
    config, workload = files(tmp_path, config=CONFIG.replace("controller: {tick: 1s}",
                                                             "controller: {tick: 1s, keep_finished: 60s}"),
                             workload="jobs:\n  - {submit: 0, runtime: 10}\n  - {submit: 5000, runtime: 10, exit: 2}\n")
    sim = TickSimulation(config, load_workload(workload), after_tick=checked)
    try:
        sim.run_to_end()
        store = sim.run.ctl.store
        assert store.retain(START + sim.now - 60, 100).jobs == 0  # what retention asks at the end
        assert store.prune_archive(START + sim.now, 100) == 0
        figures = report.summary_json(sim)
    finally:
        sim.close()
    assert figures["states"] == {"DONE": 1, "EXIT": 1} and figures["makespan"] == 5010
