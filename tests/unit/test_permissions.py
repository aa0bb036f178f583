"""The permission policy (controller/permissions.py), table-driven: who may act on which job, who
may submit to a queue, what others see of a job, and what a refusal says."""

from __future__ import annotations

import pytest

from xce_lite.controller.permissions import (
    ACTIONS,
    PROJECT_VIEW,
    Policy,
    Who,
    is_admin,
    may,
    may_submit,
    redact,
    refusal,
    sees_in_full,
)

OWNER = 500  # the controller's uid in personal mode
SHARED = Policy.of(0, True, ["boss", "@staff"], {"lab": ["carol"], "lab/vision": ["dave", "@vis-admins"],
                                                 "other": []}, "summary")
PERSONAL = Policy.of(OWNER, False, [], {"lab": ["carol"]})

ALICE = Who("alice", 1001, frozenset({"alice", "lab"}))
BOB = Who("bob", 1002, frozenset({"bob"}))
BOSS = Who("boss", 1003, frozenset({"boss"}))
STAFFER = Who("erin", 1004, frozenset({"erin", "staff"}))
CAROL = Who("carol", 1005, frozenset({"carol"}))
DAVE = Who("dave", 1006, frozenset({"dave"}))
FRANK = Who("frank", 1007, frozenset({"frank", "vis-admins"}))
ROOT = Who("root", 0, frozenset({"root"}))


@pytest.mark.parametrize("who, admin", [(ROOT, True), (BOSS, True), (STAFFER, True), (ALICE, False),
                                        (CAROL, False), (Who("x", 0), True)])
def test_admins_of_a_shared_cluster_are_root_the_named_users_and_the_named_groups(who, admin):
    assert is_admin(who, SHARED) is admin


def test_in_personal_mode_the_admins_are_root_and_the_controllers_user_only():
    assert is_admin(Who("me", OWNER), PERSONAL) and is_admin(ROOT, PERSONAL)
    # admins: is a shared-mode key; a personal policy built with names still ignores them
    assert not is_admin(BOSS, Policy.of(OWNER, False, ["boss"], {}))


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("who, owner, project, allowed", [
    (ALICE, "alice", None, True),  # her own job
    (BOB, "alice", None, False),  # another user's
    (BOB, "alice", "lab/vision", False),
    (BOSS, "alice", None, True),  # an admin by name
    (STAFFER, "alice", "lab", True),  # an admin by group
    (CAROL, "alice", "lab", True),  # an admin of the project
    (CAROL, "alice", "lab/vision/gpu", True),  # ... and of its subtree
    (CAROL, "alice", "labx", False),  # not a path prefix: another project
    (DAVE, "alice", "lab/vision", True),
    (DAVE, "alice", "lab", False),  # an admin of a child project has no say over its parent
    (FRANK, "alice", "lab/vision/gpu", True),  # a project admin by group (@vis-admins)
    (CAROL, "alice", None, False),  # a job of no project
    (CAROL, "alice", "other", False),  # a project with no admins
])
def test_who_may_act_on_a_job(action, who, owner, project, allowed):
    assert may(action, who, owner, project, SHARED) is allowed


def test_project_view_is_the_project_admins_and_the_admins_not_every_member():
    assert may(PROJECT_VIEW, CAROL, "alice", "lab/vision", SHARED)
    assert may(PROJECT_VIEW, BOSS, "alice", "lab/vision", SHARED)
    assert not may(PROJECT_VIEW, ALICE, "alice", "lab/vision", SHARED)
    with pytest.raises(ValueError):
        may("explode", ALICE, "alice", None, SHARED)


def test_a_refusal_names_the_action_the_owner_and_who_may_instead():
    text = refusal("kill", BOB, "42", "alice", "lab/vision", SHARED)
    assert text.startswith("bob may not kill job 42: it belongs to alice (project lab/vision)")
    for name in ("its owner alice", "root", "boss", "members of group staff",
                 "the admins of project lab/vision (@vis-admins, dave)", "the admins of project lab (carol)"):
        assert name in text
    personal = refusal("hold", BOB, "7[3]", "me", None, PERSONAL)
    assert personal == ("bob may not hold job 7[3]: it belongs to me; "
                        "only its owner me or the cluster's owner or root may")


def test_queue_acls_take_the_named_users_and_groups_and_admins_and_say_who_may():
    assert may_submit(BOB, "q", None, None, SHARED) is None  # no list: everyone
    assert may_submit(ALICE, "q", ["alice"], None, SHARED) is None
    assert may_submit(ALICE, "q", None, ["lab"], SHARED) is None
    assert may_submit(BOSS, "q", ["alice"], None, SHARED) is None
    why = may_submit(BOB, "gpu", ["alice"], ["lab"], SHARED)
    assert why is not None and why.startswith("queue gpu takes jobs only from users alice and members of group(s) lab")
    assert "bob is not one of them" in why
    assert may_submit(BOB, "gpu", [], [], SHARED) is not None  # empty lists: admins only


def test_summary_visibility_hides_the_command_environment_cwd_and_outputs_of_others_jobs():
    job = {"id": 1, "user": "alice", "state": "RUN", "command": ["./secret", "--token=x"], "cwd": "/home/alice",
           "stdout": "/home/alice/o", "stderr": None, "effective": [["env", "K=V", "job"]], "app_params": {},
           "meta": {}, "queue": "normal", "name": "run"}
    shown = redact(job)
    assert {"command", "cwd", "stdout", "stderr", "effective", "app_params", "meta"}.isdisjoint(shown)
    assert shown["hidden"] == sorted(["app_params", "command", "cwd", "effective", "meta", "stderr", "stdout"])
    assert (shown["id"], shown["user"], shown["state"], shown["queue"], shown["name"]) == (1, "alice", "RUN", "normal",
                                                                                           "run")
    assert not sees_in_full(BOB, "alice", None, SHARED)
    assert sees_in_full(ALICE, "alice", None, SHARED) and sees_in_full(CAROL, "alice", "lab", SHARED)
    assert sees_in_full(BOB, "alice", None, Policy.of(0, True, [], {}, "full"))
