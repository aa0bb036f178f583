"""Application profiles end to end: a real controller and CLI, jobs that print their environment,
`xce apps`, `xce jobs -l` and `xce why` with origins, `xce reconfig` live, and `xceadmin check`
against a running cluster. Then one deterministic interleaving, driven with the pure scheduler
core and a real store: a profile that changes between the decision and the dispatch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from xce_lite.api.caller import Caller
from xce_lite.config.checks import RUNNING_CONFIG_META
from xce_lite.config.sched_view import hosts_now, shared_free
from xce_lite.controller.core import Controller
from xce_lite.home.paths import Home
from xce_lite.models import PEND
from xce_lite.sched.core import HOST_OK, Snapshot, schedule
from xce_lite.store.jobs import JobStore, TickWrites

CONFIG = """\
cluster: tapp{pid}
hosts:
  - {{name: local, slots: 2, mem: 1G, tags: [fast]}}
queues:
  - {{name: normal, default: true, run_limit: 1h}}
shared: {{lic: 2}}
default_application: sim
controller: {{tick: 1s, grace: 2s}}
"""
APPS = """\
applications:
  sim:
    description: the simulator
    env: {SIM_HOME: /opt/sim, SHARED: profile}
    resources:
      select: fast
      rusage: {mem: 100M, lic: {default: 1, per: job}}
    limits: {run_limit: 10m}
    tasks: {min: 1, max: 2, default: 2}
    job_starter: [env, STARTED_BY=starter]
    params: {SOLVER: direct, THREADS: "2"}
    annotations: {team.owner: imaging}
"""
ENV_OF_JOB = ("sh", "-c", "env | grep -E '^(XCE_APP|SIM_HOME|SHARED|STARTED_BY|XCE_SLOTS)' | sort")


@pytest.fixture
def apps_cluster():
    c = Cluster(config=CONFIG.format(pid=os.getpid()))
    (c.home / "applications.yaml").write_text(APPS)
    try:
        c.start()
        yield c
    finally:
        c.close()


def env_lines(cluster: Cluster, job_id: int) -> dict[str, str]:
    text = (cluster.work / f"xce-{job_id}.out").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def effective_rows(cluster: Cluster, job_id: int) -> dict[str, tuple[str, str]]:
    """`xce jobs -l`'s effective rows: field -> (value, origin)."""
    out = cluster.ok("jobs", "-l", str(job_id))
    after = out.split("Effective values [where from]:\n", 1)[1].splitlines()
    parsed = {}
    for line in after:
        if not line.startswith("    "):
            break
        head, origin = line.strip().rsplit("[", 1)
        field, value = head.rstrip().split("  ", 1)
        parsed[field] = (value.strip(), origin.rstrip("]"))
    return parsed


def test_params_annotations_env_layers_and_job_starter_reach_the_job(apps_cluster: Cluster):
    job_id = apps_cluster.submit(*ENV_OF_JOB, options=("--app-param", "THREADS=8", "--env", "SHARED=job",
                                                       "--env", "XCE_APP_PARAM_STALE=from a parent job"))
    assert apps_cluster.xce("wait", str(job_id)).returncode == 0
    assert env_lines(apps_cluster, job_id) == {
        "SIM_HOME": "/opt/sim", "SHARED": "job",  # the profile's env, the job's on top
        "STARTED_BY": "starter",  # the job ran as job_starter + its command
        "XCE_APP": "sim", "XCE_APP_ANN_TEAM_OWNER": "imaging",
        "XCE_APP_PARAM_SOLVER": "direct", "XCE_APP_PARAM_THREADS": "8",  # declared default, own value
        "XCE_SLOTS": "2",  # the profile's default task count
    }
    job = apps_cluster.job(job_id)
    assert (job["app"], job["app_params"], job["slots"]) == ("sim", {"THREADS": "8"}, 2)  # its own values kept


def test_no_profile_and_refusals_at_submit(apps_cluster: Cluster):
    plain = apps_cluster.submit(*ENV_OF_JOB, options=("-app", ""))
    assert apps_cluster.xce("wait", str(plain)).returncode == 0
    assert env_lines(apps_cluster, plain) == {"XCE_SLOTS": "1"}
    for options, message in [
        (("--app-param", "NOPE=1"), "application sim declares no such param (it declares: SOLVER, THREADS"),
        (("-W", "20m"), "run limit -W 0:20:00 is above application sim's run limit of 0:10:00"),
        (("-n", "4"), "-n 4: application sim runs jobs of 1 to 2 tasks"),
        (("-R", "rusage[lic=1]"), "application sim reserves lic per job, so the unit must match"),
        (("-app", "nosuch"), "application 'nosuch' is not defined; the applications are: default, sim"),
    ]:
        refused = apps_cluster.xce("submit", *options, "--", "true")
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert apps_cluster.ok("jobs", "-a", "--json").count('"id"') == 1  # nothing else was stored


def test_apps_jobs_l_and_why_show_every_effective_field_with_its_origin(apps_cluster: Cluster):
    listing = apps_cluster.ok("apps")
    assert "sim" in listing and "the simulator" in listing and "default" in listing
    long = apps_cluster.ok("apps", "-l")
    assert "APPLICATION sim  (the default application)" in long and "rusage lic" in long and "1 per job" in long
    blocker = apps_cluster.submit("sleep", "60", options=("-app", "", "-n", "2"))
    apps_cluster.wait_state(blocker, {"RUN"})
    waiting = apps_cluster.submit("true", options=("-R", "rusage[mem=200M]", "-W", "5m"))
    rows = effective_rows(apps_cluster, waiting)
    assert rows["application"][1] == "default"  # from default_application
    assert rows["tasks"] == ("2", "profile")
    assert rows["select"] == ("fast", "profile")
    assert rows["rusage mem"] == ("200M/task", "job") and rows["rusage lic"] == ("1/job", "profile")
    assert rows["run limit"] == ("0:05:00", "job") and rows["param SOLVER"] == ("direct", "profile")
    why = apps_cluster.ok("why", str(waiting))
    assert "What it asks for [where from]:" in why and "rusage lic" in why and "[profile]" in why
    assert "slots" in why  # and why it waits: the blocker holds the slots
    apps_cluster.ok("kill", str(blocker), str(waiting))


def test_reconfig_pending_jobs_see_new_values_running_ones_keep_theirs(apps_cluster: Cluster):
    running = apps_cluster.submit("sh", "-c", "echo SIM_HOME=$SIM_HOME; sleep 60", options=("-n", "1"))
    apps_cluster.wait_state(running, {"RUN"})
    held = apps_cluster.submit(*ENV_OF_JOB, options=("-H", "-n", "1"))
    old_hash = effective_rows(apps_cluster, held)["application"][0]
    (apps_cluster.home / "applications.yaml").write_text(APPS.replace("/opt/sim", "/opt/sim2"))

    check = subprocess.run([sys.executable, "-m", "xce_lite.cli.admin", "check"], env=apps_cluster.env,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert f"pending job {held} changes: application, env SIM_HOME" in check.stdout  # before it applies
    dry = apps_cluster.ok("reconfig", "--dry-run")
    assert f"pending job {held} changes" in dry and "Would change the effective values of 1" in dry
    assert effective_rows(apps_cluster, held)["application"][0] == old_hash  # nothing applied yet

    assert "Reconfigured; changed the effective values of 1 pending job(s)." in apps_cluster.ok("reconfig")
    assert effective_rows(apps_cluster, held)["application"][0] != old_hash
    assert effective_rows(apps_cluster, running)["application"][0] == old_hash  # fixed at its dispatch
    apps_cluster.ok("kill", str(running))
    apps_cluster.ok("release", str(held))
    assert apps_cluster.xce("wait", str(held)).returncode == 0
    assert env_lines(apps_cluster, held)["SIM_HOME"] == "/opt/sim2"


def test_reconfig_with_an_error_changes_nothing_and_a_vanished_profile_pends(apps_cluster: Cluster):
    apps_file = apps_cluster.home / "applications.yaml"
    apps_file.write_text(APPS.replace("limits:", "limitz:"))
    broken = apps_cluster.xce("reconfig")
    assert broken.returncode == 2 and "applications.sim.limitz (line 8): Extra inputs" in broken.stderr
    held = apps_cluster.submit("true", options=("-H",))
    apps_file.write_text(APPS.replace("  sim:", "  sim2:").replace("default_application: sim", ""))
    (apps_cluster.home / "xce.yaml").write_text(CONFIG.format(pid=os.getpid()).replace(
        "default_application: sim", "default_application: sim2"))
    apps_cluster.ok("reconfig")
    apps_cluster.ok("release", str(held))
    reason = "cannot run as configured now: application 'sim' is not defined"
    job = apps_cluster.wait_state(held, {"PEND"})
    wait_until(lambda: reason in (apps_cluster.job(held)["pend_reason"] or ""), 20, "the pend reason to say why")
    assert job["state"] == "PEND"  # never EXIT: putting the profile back lets it run
    apps_file.write_text(APPS)
    (apps_cluster.home / "xce.yaml").write_text(CONFIG.format(pid=os.getpid()))
    apps_cluster.ok("reconfig")
    assert apps_cluster.xce("wait", str(held)).returncode == 0


# ---- the interleaving: decision, reconfig, dispatch ------------------------------------------------

INTERLEAVINGS = {
    "changed": APPS.replace("/opt/sim", "/opt/sim-v2"),
    "vanished": APPS.replace("  sim:", "  other:").replace("default_application: sim", ""),
}


@pytest.mark.parametrize("change", sorted(INTERLEAVINGS))
def test_a_profile_changed_between_decision_and_dispatch_sends_the_job_back_to_pend(change: str):
    root = Path(tempfile.mkdtemp(prefix="xce-il-"))  # short: the home's socket path must fit in 107 bytes
    (root / "xce.yaml").write_text(CONFIG.format(pid=os.getpid()))
    (root / "applications.yaml").write_text(APPS)
    (root / "work").mkdir()
    controller = Controller(Home(root), log=lambda _message: None)
    try:
        caller = Caller(os.getuid(), os.getpid(), "alice")
        job_id = controller.api_submit(caller, {}, {"jobs": [{"argv": ["true"], "cwd": str(root / "work")}]})["ids"][0]

        def decide():
            hosts = hosts_now(controller.state.host_totals, {"local": HOST_OK}, [])
            return schedule(Snapshot(hosts, tuple(controller.state.pending.values()), controller.state.queue_policies,
                                     shared_free(controller.config, [])))

        decided = decide()  # 1. the scheduler decides on the profile as it was
        old_hash = controller.state.profiles["sim"].hash
        assert [(d.job_id, d.profile_hash) for d in decided.dispatches] == [(job_id, old_hash)]
        (root / "applications.yaml").write_text(INTERLEAVINGS[change])  # 2. the profile changes
        if change == "vanished":
            (root / "xce.yaml").write_text(CONFIG.format(pid=os.getpid()).replace("default_application: sim\n", ""))
        controller.config_api.reconfigure()
        assert controller.dispatching.plans(decided) == []  # 3. the dispatch of that decision is declined
        job = controller.store.get(job_id)
        assert job.state == PEND and job.effective is None
        kinds = [(kind, data) for _t, kind, data in controller.store.events(job_id)]
        assert kinds[-1][0] == "dispatch_declined" and kinds[-1][1]["decided_profile_hash"] == old_hash
        if change == "vanished":  # 4. it waits, with the reason, until the profile comes back
            assert controller.state.pending.get(job_id).blocked.endswith("application 'sim' is not defined; the "
                                                                    "applications are: default, other (see `xce apps`)")
            assert decide().dispatches == ()
            return
        again = decide()  # 4. the next session decides on the new profile, and that dispatch holds
        plans = controller.dispatching.plans(again)
        assert [plan.job_id for plan in plans] == [job_id]
        controller.store.record_tick(TickWrites(time.time(), plans=plans))
        job = controller.store.get(job_id)
        assert job.state == "DISP" and job.effective["profile_env"]["SIM_HOME"] == "/opt/sim-v2"
        assert job.effective["profile_hash"] == controller.state.profiles["sim"].hash != old_hash
        dispatched = [data for _t, kind, data in controller.store.events(job_id) if kind == "dispatched"]
        assert dispatched[0]["profile_hash"] == job.effective["profile_hash"]
    finally:
        controller._scheduler.close()
        controller.store.close()
        shutil.rmtree(root, ignore_errors=True)


def test_the_running_config_is_kept_for_xceadmin(apps_cluster: Cluster):
    store = JobStore(apps_cluster.home / "xce.db", readonly=True)
    try:
        kept = json.loads(store.meta(RUNNING_CONFIG_META))
    finally:
        store.close()
    assert kept == {"applications.yaml": APPS, "xce.yaml": CONFIG.format(pid=os.getpid())}


def test_the_controller_does_not_start_with_an_undefined_default_application(idle_cluster: Cluster):
    config = (idle_cluster.home / "xce.yaml").read_text()
    (idle_cluster.home / "xce.yaml").write_text(config + "default_application: nope\n")
    started = idle_cluster.xce("controller", "start")
    assert started.returncode == 2
    line = len(config.splitlines()) + 1
    assert f"default_application (line {line}): no application profile 'nope' is defined" in started.stderr


def test_reconfig_refuses_to_drop_a_queue_that_still_has_jobs(apps_cluster: Cluster):
    held = apps_cluster.submit("true", options=("-H",))
    config = apps_cluster.home / "xce.yaml"
    config.write_text(config.read_text().replace("name: normal", "name: other"))
    refused = apps_cluster.xce("reconfig")
    assert refused.returncode == 2 and "queue normal still has 1 unfinished job(s)" in refused.stderr
    assert "nothing was changed" in refused.stderr and apps_cluster.job(held)["queue"] == "normal"
