"""End to end through the real controller: submit, run, wait, list, kill, hold, release."""

from __future__ import annotations

import json
import os
import sys
import textwrap

from tests.support.cluster import Cluster
from tests.support.waiting import wait_until


def test_submit_runs_the_job_and_wait_reports_done(cluster: Cluster):
    out = cluster.ok("submit", "-J", "greet", "--", "sh", "-c", "echo hello; echo oops >&2")
    assert out.startswith("Job <") and out.rstrip().endswith("is submitted to queue <normal>.")
    job_id = int(out.split("<")[1].split(">")[0])

    waited = cluster.xce("wait", str(job_id))
    assert waited.returncode == 0, waited.stderr
    assert f"Job <{job_id}> DONE" in waited.stdout

    # default output: xce-<id>.out in the submit directory, stderr merged into it
    assert (cluster.work / f"xce-{job_id}.out").read_text() == "hello\noops\n"
    job = cluster.job(job_id)
    assert job["state"] == "DONE" and job["exit_code"] == 0 and job["name"] == "greet"
    assert job["start_time"] <= job["end_time"] and job["cpu_time"] is not None and job["max_rss"] > 0
    listing = cluster.ok("jobs", "-a")
    assert "JOBID" in listing and f"{job_id}" in listing and "DONE" in listing


def test_failed_job_is_exit_with_its_code_and_wait_exits_1(cluster: Cluster):
    job_id = cluster.submit("sh", "-c", "exit 3")
    waited = cluster.xce("wait", str(job_id))
    assert waited.returncode == 1
    assert "EXIT" in waited.stdout and "exit code 3" in waited.stdout
    assert cluster.job(job_id)["exit_code"] == 3


def test_output_paths_expand_job_id_and_keep_stderr_apart(cluster: Cluster):
    job_id = cluster.submit("sh", "-c", "echo out; echo err >&2", options=("-o", "o-%J.txt", "-e", "e-%J.txt"))
    assert cluster.xce("wait", str(job_id)).returncode == 0
    assert (cluster.work / f"o-{job_id}.txt").read_text() == "out\n"
    assert (cluster.work / f"e-{job_id}.txt").read_text() == "err\n"


def test_arguments_env_and_paths_reach_the_job_byte_exact(cluster: Cluster):
    odd_dir = cluster.work / "dïr with space;$(x)"
    odd_dir.mkdir()
    script = odd_dir / "echo.py"
    script.write_text(textwrap.dedent("""\
        import json, os, sys
        with open(sys.argv[1], "w", encoding="utf-8", errors="surrogateescape") as f:
            json.dump({"argv": sys.argv[2:], "env": os.environ["ODD"], "cwd": os.getcwd(),
                       "name": os.environ["XCE_JOB_NAME"]}, f)
        """))
    args = ["$HOME", "`id`", "a'b\"c", "semi;colon && echo hi", "new\nline", "ünïcødé ✓", "*", "", "-n"]
    odd_env = "line1\nline2 $PATH 'q' \"dq\" ✓"
    result_file = odd_dir / "result.json"
    odd_name = "naïve $(rm -rf) 'job'\n✓"
    job_id = cluster.submit(sys.executable, str(script), str(result_file), *args,
                            options=("--cwd", str(odd_dir), "--env", f"ODD={odd_env}", "-o", "out-%J",
                                     "-J", odd_name))
    assert cluster.xce("wait", str(job_id)).returncode == 0, cluster.job(job_id)
    seen = json.loads(result_file.read_text(encoding="utf-8"))
    assert seen == {"argv": args, "env": odd_env, "cwd": str(odd_dir), "name": odd_name}
    assert cluster.job(job_id)["name"] == odd_name
    assert (odd_dir / f"out-{job_id}").exists()
    assert cluster.job(job_id)["command"][3:] == args


def test_kill_pending_and_running_jobs(cluster: Cluster):
    running = [cluster.submit("sleep", "300") for _ in range(2)]
    for job_id in running:
        cluster.wait_state(job_id, {"RUN"})
    pending = cluster.submit("sleep", "300")  # the host has 2 slots: this one waits
    assert cluster.wait_state(pending, {"PEND"})["state"] == "PEND"

    killed = cluster.xce("kill", *map(str, running + [pending]))
    assert killed.returncode == 0, killed.stderr
    for job_id in running + [pending]:
        job = cluster.wait_state(job_id, {"EXIT"})
        assert "killed by" in job["reason"]
    assert cluster.xce("kill", str(pending)).returncode == 1  # already finished: refused, said so


def test_hold_and_release(cluster: Cluster):
    held = cluster.submit("true", options=("--hold",))
    assert cluster.job(held)["state"] == "PSUSP"
    other = cluster.submit("true")
    assert cluster.xce("wait", str(other)).returncode == 0
    assert cluster.job(held)["state"] == "PSUSP"  # the scheduler left it alone
    assert cluster.xce("release", str(held)).returncode == 0
    assert cluster.xce("wait", str(held)).returncode == 0


def test_pending_job_shows_why_it_waits(cluster: Cluster):
    blockers = [cluster.submit("sleep", "300") for _ in range(2)]
    for job_id in blockers:
        cluster.wait_state(job_id, {"RUN"})
    waiting = cluster.submit("true")
    from tests.support.waiting import wait_until

    wait_until(lambda: cluster.job(waiting)["pend_reason"], 10, "a pend reason")
    assert cluster.job(waiting)["pend_reason"] == "local: slots needed 1, free 0"
    assert "Pending: local: slots needed 1, free 0" in cluster.ok("jobs", "-l", str(waiting))
    assert "local: slots needed 1, free 0" in cluster.ok("jobs", "-p")
    why = cluster.ok("why", str(waiting))
    assert f"Job <{waiting}> PEND: local: slots needed 1, free 0" in why
    cluster.ok("kill", *map(str, blockers))
    assert cluster.xce("wait", str(waiting)).returncode == 0


def test_queue_priority_goes_first(idle_cluster: Cluster):
    c = idle_cluster
    c.start()
    blocker = c.submit("sleep", "300", options=("-n", "2"))
    c.wait_state(blocker, {"RUN"})
    order_file = c.work / "order"
    low = c.submit("sh", "-c", f"echo low >> {order_file}", options=("-n", "2"))
    high = c.submit("sh", "-c", f"echo high >> {order_file}", options=("-n", "2", "-q", "high"))
    c.ok("kill", str(blocker))
    assert c.xce("wait", str(low), str(high)).returncode == 0
    # only one fits at a time: the later job of the higher-priority queue runs first
    assert order_file.read_text() == "high\nlow\n"


def test_run_limit_ends_the_job_with_a_reason(cluster: Cluster):
    job_id = cluster.submit("sleep", "60", options=("-W", "2s"))
    waited = cluster.xce("wait", str(job_id))
    assert waited.returncode == 1
    job = cluster.job(job_id)
    assert job["state"] == "EXIT" and "run limit" in job["reason"]


def test_hosts_and_queues_list(cluster: Cluster):
    hosts = cluster.ok("hosts")
    assert "local" in hosts and "ok" in hosts
    queues = cluster.ok("queues")
    assert "normal" in queues and "high" in queues
    assert json.loads(cluster.ok("queues", "--json"))["queues"][0]["default"] is True
    status = cluster.ok("controller", "status")
    assert "is running" in status and str(cluster.controller_pid) in status


def test_users_see_their_own_jobs_by_default(cluster: Cluster):
    job_id = cluster.submit("true")
    cluster.ok("wait", str(job_id))
    mine = json.loads(cluster.ok("jobs", "-a", "--json"))["jobs"]
    assert [j["id"] for j in mine] == [job_id]
    assert mine[0]["user"] == os.environ.get("USER", mine[0]["user"])


def test_kill_right_after_submit_never_leaves_a_job_behind(cluster: Cluster):
    """A kill may race the job's launch; whichever wins, the job ends EXIT and nothing runs on."""
    ids = [cluster.submit("sleep", "300") for _ in range(4)]
    assert cluster.xce("kill", *map(str, ids)).returncode == 0
    for job_id in ids:
        job = cluster.wait_state(job_id, {"EXIT"}, timeout=30)
        assert job["reason"].startswith("killed by")
    from tests.support.waiting import wait_until

    wait_until(lambda: cluster.supervisor_pids() == [], 15, "no supervisor left running")


def test_hold_of_a_finished_job_is_refused_with_the_lifecycle_reason(cluster: Cluster):
    job_id = cluster.submit("true")
    cluster.ok("wait", str(job_id))
    refused = cluster.xce("hold", str(job_id))
    assert refused.returncode == 1
    assert f"Job <{job_id}>: a job in state DONE cannot be held" in refused.stderr
    assert cluster.xce("release", str(job_id)).returncode == 1


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_suspend_stops_the_job_and_resume_lets_it_go_on(cluster: Cluster):
    pid_file = cluster.work / "pid"
    job_id = cluster.submit("sh", "-c", f"echo $$ > {pid_file}; while :; do sleep 0.1; done")
    cluster.wait_state(job_id, {"RUN"})
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 10, "the job to write its pid")
    pid = int(pid_file.read_text())
    assert "is suspended" in cluster.ok("suspend", str(job_id))
    assert cluster.job(job_id)["state"] == "USUSP"
    wait_until(lambda: _process_state(pid) == "T", 10, "the job's shell to be stopped")
    again = cluster.xce("suspend", str(job_id))
    assert again.returncode == 1 and "cannot be suspended" in again.stderr
    assert "is resumed" in cluster.ok("resume", str(job_id))
    assert cluster.job(job_id)["state"] == "RUN"
    wait_until(lambda: _process_state(pid) != "T", 10, "the job's shell to run again")
    cluster.ok("kill", str(job_id))
    assert cluster.wait_state(job_id, {"EXIT"})["reason"].startswith("killed by")


def test_peek_shows_the_output_so_far_and_follows_it_to_the_end(cluster: Cluster):
    gate = cluster.work / "gate"
    job_id = cluster.submit("sh", "-c", f"echo first; while [ ! -e {gate} ]; do sleep 0.1; done; echo second")
    cluster.wait_state(job_id, {"RUN"})
    wait_until(lambda: cluster.ok("peek", str(job_id)) == "first\n", 10, "peek to show the first line")
    gate.touch()
    assert cluster.ok("peek", "-f", str(job_id)) == "first\nsecond\n"
    assert cluster.job(job_id)["state"] == "DONE"
    missing = cluster.xce("peek", "-e", str(job_id))
    assert missing.returncode == 2 and "has no error file of its own" in missing.stderr
