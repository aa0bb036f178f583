"""End to end: projects, limits that roll up, holds after a reconfig, and fair share, through the real
controller, its store and the CLI.

The tests run as root, whose group is `root`: membership by name and by group, and the group default,
are both exercised with it; other users are the pure policy's tests (tests/sched/test_projects_policy.py).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.support.cluster import Cluster, running_cluster
from tests.support.waiting import wait_until

CONFIG = f"""\
cluster: p{os.getpid()}
hosts:
  - name: local
    slots: 4
    mem: 1G
    gpus: 4
queues:
  - {{name: normal, default: true}}
projects:
  - {{name: lab, members: [root], admins: [root], limits: {{gpus: 3}}}}
  - {{name: lab/vision, members: [root], limits: {{slots: 2, jobs: 2}}}}
  - {{name: lab/nlp, groups: [root]}}
  - {{name: teaching, members: [nobody-here]}}
groups: {{root: {{default_project: lab/vision}}}}
default_project: teaching
controller:
  tick: 1s
  grace: 1s
"""


@pytest.fixture
def pcluster():
    with running_cluster(config=CONFIG) as c:
        yield c


def refused(c: Cluster, *args: str) -> str:
    result = c.xce("submit", *args, "--", "true")
    assert result.returncode == 2, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def test_submit_checks_membership_resolves_defaults_and_refuses_what_no_limit_allows(pcluster: Cluster):
    c = pcluster
    assert "you (root) are not a member of project teaching" in refused(c, "-P", "teaching")
    assert "there is no project 'nope'; give -P with one of yours: lab, lab/vision, lab/nlp" in refused(c, "-P", "nope")
    assert "project lab/vision allows at most 2 slots at once (its limits.slots); this job needs at least 3" in \
        refused(c, "-P", "lab/vision", "-n", "3")
    assert "project lab allows at most 3 gpus" in refused(c, "-P", "lab/nlp", "--gpus", "4")  # the parent's limit
    assert "is not a project path" in refused(c, "-P", "bad//path")
    assert json.loads(c.ok("jobs", "--json", "-a"))["jobs"] == []  # nothing was stored

    default = c.submit("true")  # root's group default
    by_group = c.submit("true", options=("-P", "lab/nlp"))
    assert c.wait_state(default, {"DONE"})["project"] == "lab/vision"
    assert c.wait_state(by_group, {"DONE"})["project"] == "lab/nlp"
    assert "Project: lab/vision" in c.ok("jobs", "-l", str(default))
    listed = json.loads(c.ok("jobs", "--json", "-a", "-P", "lab/nlp"))["jobs"]
    assert [j["id"] for j in listed] == [by_group]
    tree = json.loads(c.ok("projects", "--json"))
    assert [p["name"] for p in tree["projects"]] == ["lab", "lab/nlp", "lab/vision", "teaching"]
    lab = tree["projects"][0]
    assert lab["admins"] == ["root"] and lab["limits"] == {"gpus": 3} and lab["yours"]
    assert not tree["projects"][3]["yours"] and tree["default"] == "teaching"
    assert "* lab" in c.ok("projects") and "Admins: root" in c.ok("projects", "-l")


def edit_config(c: Cluster, old: str, new: str) -> None:
    path = c.home / "xce.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def reason(c: Cluster, job_id: int) -> str:
    return c.job(job_id).get("pend_reason") or c.job(job_id).get("reason") or ""


def test_limits_roll_up_pend_with_the_project_reason_and_holds_survive_reconfig_and_restart(pcluster: Cluster):
    c = pcluster
    nlp = c.submit("sleep", "300", options=("-P", "lab/nlp", "--gpus", "2"))
    c.wait_state(nlp, {"RUN"})
    gpu = c.submit("sleep", "300", options=("-P", "lab/vision", "--gpus", "2"))
    # lab/nlp's 2 GPUs count against lab, whose limit is 3: the GPU job of lab/vision waits for lab
    wait_until(lambda: reason(c, gpu) == "project lab: gpus 2 of 3 in use, the job needs 2", 20,
               f"job {gpu}'s project reason (last: {reason(c, gpu)!r})")
    wide = c.submit("sleep", "300", options=("-P", "lab/vision", "-n", "2"))
    c.wait_state(wide, {"RUN"})
    more = c.submit("sleep", "300", options=("-P", "lab/vision",))
    wait_until(lambda: reason(c, more) == "project lab/vision: slots 2 of 2 in use", 20,
               f"job {more}'s project reason (last: {reason(c, more)!r})")
    assert json.loads(c.ok("why", "--json", str(more)))["summary"] == "project lab/vision: slots 2 of 2 in use"
    use = {p["name"]: p["use"] for p in json.loads(c.ok("projects", "--json"))["projects"]}
    assert (use["lab"]["gpus"], use["lab"]["slots"], use["lab"]["jobs"]) == (2, 3, 2)
    assert (use["lab/vision"]["slots"], use["lab/nlp"]["gpus"]) == (2, 2)

    # root leaves lab/vision: its pending jobs are held with why; the running one goes on
    edit_config(c, "name: lab/vision, members: [root]", "name: lab/vision, members: []")
    c.ok("reconfig")
    for job_id in (gpu, more):
        held = c.wait_state(job_id, {"PSUSP"})
        assert held["reason"] == ("root is no longer a member of project lab/vision; kill the job, or add the "
                                  "membership again and release it")
    assert c.job(wide)["state"] == "RUN" and c.job(nlp)["state"] == "RUN"

    # a controller killed, and the project removed while it was down: still held, nothing killed
    c.kill9_controller()
    edit_config(c, "  - {name: lab/vision, members: [], limits: {slots: 2, jobs: 2}}\n", "")
    edit_config(c, "default_project: lab/vision", "default_project: lab/nlp")
    c.start()
    late = c.submit("sleep", "300", options=("-P", "lab/nlp", "-n", "2", "-H"))
    assert "there is no project 'lab/vision'" in refused(c, "-P", "lab/vision")
    assert c.wait_state(wide, {"RUN"})["state"] == "RUN"
    assert {c.job(j)["state"] for j in (gpu, more, late)} == {"PSUSP"}
    assert "Traceback" not in c.ok("projects", "-l")
    listed = {p["name"]: p for p in json.loads(c.ok("projects", "--json"))["projects"]}
    assert not listed["lab/vision"]["defined"] and listed["lab/vision"]["held"] == 2  # its jobs still show
    release = c.xce("release", str(gpu))
    assert release.returncode == 1 and f"Job <{gpu}> stays held: project lab/vision is no longer defined" in \
        release.stderr

    # the project back, then released: the limit holds them as before (wide still runs)
    edit_config(c, "  - {name: lab/nlp, groups: [root]}\n",
                "  - {name: lab/nlp, groups: [root]}\n  - {name: lab/vision, members: [root], limits: {slots: 2}}\n")
    c.ok("reconfig")
    c.ok("release", str(more))
    wait_until(lambda: reason(c, more) == "project lab/vision: slots 2 of 2 in use", 20,
               f"job {more} to pend on the limit again (last: {reason(c, more)!r})")
    c.ok("kill", str(wide))
    c.wait_state(more, {"RUN"})
    c.ok("kill", str(nlp), str(more), str(gpu), str(late))


FAIR = CONFIG.replace("  - {name: normal, default: true}\n",
                      "  - name: normal\n    default: true\n    fairshare: {by: project, half_life: 1h}\n")


def test_fair_share_by_project_puts_the_less_used_project_first(tmp_path):
    c = Cluster(config=FAIR.replace("slots: 4", "slots: 1"))
    c.start()
    try:
        used = c.submit("sleep", "2", options=("-P", "lab/nlp"))
        c.wait_state(used, {"DONE"})  # lab/nlp now has past usage; lab has none
        c.kill9_controller()  # a restart reads that usage back from the store
        c.start()
        blocker = c.submit("sleep", "300", options=("-P", "lab/vision"))
        c.wait_state(blocker, {"RUN"})
        first = c.submit("true", options=("-P", "lab/nlp"))  # submitted first...
        second = c.submit("sleep", "300", options=("-P", "lab"))  # ...but lab has used nothing
        assert json.loads(c.ok("queues", "--json"))["queues"][0]["fairshare"]["by"] == "project"
        assert "(fair share by project)" in c.ok("queues")
        long = json.loads(c.ok("jobs", "--json", "-l", str(first)))["jobs"][0]["fairshare"]
        assert long["by"] == "project" and long["entity"] == "lab/nlp" and long["usage_slot_hours"] > 0
        assert "Fair share: project lab/nlp in queue normal: share 1" in c.ok("why", str(first))
        c.ok("kill", str(blocker))
        c.wait_state(second, {"RUN"})
        assert c.job(first)["state"] == "PEND"  # one slot: the less used project went first
        c.ok("kill", str(second))
        c.wait_state(first, {"DONE"})
    finally:
        c.close()


def test_open_mode_takes_any_project_name_for_bookkeeping(tmp_path):
    c = Cluster(slots=2)  # no projects defined
    c.start()
    try:
        labelled = c.submit("sleep", "300", options=("-P", "my/thesis", "-n", "2"))
        plain = c.submit("true")
        c.wait_state(labelled, {"RUN"})
        assert c.wait_state(plain, {"DONE", "PEND"})["project"] == "default"
        assert [j["id"] for j in json.loads(c.ok("jobs", "--json", "-P", "my/thesis"))["jobs"]] == [labelled]
        tree = json.loads(c.ok("projects", "--json"))
        assert tree["open"] and tree["default"] == "default"
        mine = {p["name"]: p for p in tree["projects"]}["my/thesis"]
        assert not mine["defined"] and mine["use"]["slots"] == 2 and mine["run"] == 1 and mine["yours"]
        assert "No projects are defined" in c.ok("projects")
        c.ok("kill", str(labelled))
    finally:
        c.close()
