"""Bad input and faults, end to end: clear messages, the right exit codes, nothing lost or doubled."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from xce_lite.store.jobs import JobStore


def _no_jobs(c: Cluster) -> bool:
    return json.loads(c.ok("jobs", "-a", "-u", "all", "--json"))["jobs"] == []


@pytest.mark.parametrize("args, expected", [
    (("-q", "nosuch", "--", "true"), "unknown queue 'nosuch'; the queues are: normal, high"),
    (("--",), "Missing argument"),
    (("-n", "0", "--", "true"), "-n"),
    (("-n", "3,2", "--", "true"), "need 1 <= MIN <= MAX"),
    (("-n", "3", "--", "true"), "needs at least 3 tasks, at most 2 fit"),
    (("-R", "select[mem>>4]", "--", "true"), "at column 12: expected"),
    (("-R", "rusage[fpga=1]", "--", "true"), "fpga"),
    (("-R", "select[type==ARM]", "--", "true"), 'no host matches select[type=="ARM"]'),
    (("-R", "rusage[mem=64G]", "--", "true"), "mem"),
    (("-R", "rusage[gpus=2G]", "--", "true"), "gpus is a count, so the unit G does not apply"),
    (("-R", "select[slots>4K]", "--", "true"), "slots is a count"),
    (("-R", "rusage[mem=-1]", "--", "true"), "rusage amounts cannot be negative"),
    (("-W", "soon", "--", "true"), "is not a duration"),
    (("-M", "lots", "--", "true"), "is not a size"),
    (("--cwd", "/nonexistent/dir", "--", "true"), "/nonexistent/dir does not exist"),
    (("-o", "/nonexistent/dir/out", "--", "true"), "its directory does not exist"),
    (("--env", "NOEQUALS", "--", "true"), "is not NAME=VALUE"),
])
def test_bad_submit_is_refused_with_exit_2_and_nothing_stored(cluster: Cluster, args, expected):
    result = cluster.xce("submit", *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert expected in result.stderr
    assert _no_jobs(cluster)


def test_cwd_that_is_a_file_is_refused(cluster: Cluster):
    plain_file = cluster.work / "plain"
    plain_file.write_text("")
    result = cluster.xce("submit", "--cwd", str(plain_file), "--", "true")
    assert result.returncode == 2 and "not a directory" in result.stderr
    assert _no_jobs(cluster)


def test_controller_not_running_names_the_socket_and_the_fix(idle_cluster: Cluster):
    result = idle_cluster.xce("submit", "--", "true")
    assert result.returncode == 3
    assert str(idle_cluster.home / "xce.sock") in result.stderr
    assert "xce controller start" in result.stderr


def test_no_home_says_how_to_make_one(idle_cluster: Cluster):
    env = dict(idle_cluster.env, XCE_HOME=str(idle_cluster.root / "nothing-here"))
    result = idle_cluster.xce("jobs", env=env)
    assert result.returncode == 2 and "xce init" in result.stderr


def test_a_second_controller_is_refused_and_names_the_first(cluster: Cluster):
    result = cluster.xce("controller", "start", "--foreground", timeout=30)
    assert result.returncode != 0
    assert "already running" in result.stderr and str(cluster.controller_pid) in result.stderr


@pytest.mark.parametrize("content", [b"this is not a database\n" * 50, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_corrupt_or_foreign_store_is_refused_and_never_overwritten(idle_cluster: Cluster, content: bytes):
    store = idle_cluster.home / "xce.db"
    store.write_bytes(content)
    result = idle_cluster.xce("controller", "start", timeout=60)
    assert result.returncode != 0
    assert "is not an xce_lite job store" in result.stderr or "another application" in result.stderr
    assert store.read_bytes() == content


def test_init_writes_a_config_and_refuses_to_overwrite_it(idle_cluster: Cluster):
    env = dict(idle_cluster.env, XCE_HOME=str(idle_cluster.root / "fresh"))
    first = idle_cluster.xce("init", env=env)
    assert first.returncode == 0 and "Created" in first.stdout
    text = (idle_cluster.root / "fresh" / "xce.yaml").read_text()
    assert "queues:" in text and "name: normal" in text and "# " in text
    again = idle_cluster.xce("init", env=env)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_kill_9_of_the_controller_loses_nothing_and_runs_nothing_twice(cluster: Cluster):
    """Jobs running and submits arriving when the controller dies, twice in a row; after each
    restart every acknowledged job is there, each ran exactly once, running ones were adopted. A
    submit cut off mid-request asks again with its request id (at most one job). At the end the
    store passes SQLite's full integrity_check."""
    ledger = cluster.work / "ledger"
    acknowledged: list[int] = []
    cut_off: list[int] = []  # acknowledged after a lost reply and a retry
    stop = threading.Event()

    def submit_stream() -> None:
        while not stop.is_set():
            result = cluster.xce("submit", "--parsable", "--", "sh", "-c",
                                 f'echo "$XCE_JOBID $XCE_ATTEMPT" >> {ledger}; sleep 0.3; exit $((XCE_JOBID % 3))')
            if result.returncode == 0:
                acknowledged.append(int(result.stdout))
                if "reply was lost" in result.stderr:
                    cut_off.append(int(result.stdout))
            else:
                assert result.returncode == 3, result.stderr  # refused while down: said so, not stored
                time.sleep(0.05)

    long_runner = cluster.submit("sh", "-c", f'echo long >> {ledger}.long; sleep 4; exit 7')
    cluster.wait_state(long_runner, {"RUN"})
    streamer = threading.Thread(target=submit_stream)
    streamer.start()
    try:
        for round_ in (1, 2):
            wait_until(lambda n=6 * round_: len(acknowledged) >= n, 60, "acknowledged submits")
            cluster.kill9_controller()
            time.sleep(1.0)  # submits fail meanwhile; jobs go on under their supervisors
            cluster.start()
        wait_until(lambda: len(acknowledged) >= 18, 60, "more acknowledged submits after the restarts")
    finally:
        stop.set()
        streamer.join()

    everything = [long_runner, *acknowledged]
    waited = cluster.xce("wait", *map(str, everything), timeout=180)
    assert waited.returncode in (0, 1), waited.stderr
    jobs = {j["id"]: j for j in json.loads(cluster.ok("jobs", "--json", *map(str, everything)))["jobs"]}
    assert set(jobs) == set(everything)  # every acknowledged job is in the store
    ran = Counter(int(line.split()[0]) for line in ledger.read_text().splitlines())
    assert max(ran.values()) == 1  # none ran twice
    assert sorted(ran) == sorted(acknowledged)  # each acknowledged one ran, and nothing else did
    assert set(cut_off) <= set(acknowledged)
    for job_id in acknowledged:
        assert jobs[job_id]["exit_code"] == job_id % 3
        assert jobs[job_id]["state"] == ("DONE" if job_id % 3 == 0 else "EXIT")
    assert (cluster.work / "ledger.long").read_text() == "long\n"
    assert jobs[long_runner]["exit_code"] == 7 and jobs[long_runner]["state"] == "EXIT"
    cluster.ok("controller", "stop")
    store = JobStore(cluster.home / "xce.db", readonly=True)
    try:
        assert store.integrity(full=True) == "ok"
        assert {j.id for j in store.jobs(everything)} == set(everything)
    finally:
        store.close()


def test_finished_jobs_keep_their_exit_codes_across_restarts(cluster: Cluster):
    ids = [cluster.submit("sh", "-c", f"exit {code}") for code in (0, 4)]
    cluster.xce("wait", *map(str, ids))
    cluster.ok("controller", "stop")
    cluster.start()
    assert [cluster.job(i)["exit_code"] for i in ids] == [0, 4]
    assert [cluster.job(i)["state"] for i in ids] == ["DONE", "EXIT"]


def test_job_survives_a_clean_controller_stop_and_is_adopted(cluster: Cluster):
    marker = cluster.work / "survived"
    job_id = cluster.submit("sh", "-c", f"sleep 2; echo yes > {marker}")
    cluster.wait_state(job_id, {"RUN"})
    cluster.ok("controller", "stop")
    wait_until(marker.exists, 30, "the job to finish while no controller runs")
    cluster.start()
    assert cluster.xce("wait", str(job_id)).returncode == 0
    assert cluster.job(job_id)["state"] == "DONE"
