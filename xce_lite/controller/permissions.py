"""Who may do what to a job, and what others see of it: a pure policy (no I/O, no clock).

Rules (issue 16, and issue 17's project scope):
- a job's owner may act on it (kill, hold, release, requeue, suspend, resume, peek) and see it in
  full; an admin may do so on every job; a project admin on the jobs of the project's subtree
  (an admin of `lab` acts on `lab/vision`'s jobs too), and holds `project:view` there (its usage);
- admins: root and the controller's own user always; in shared mode also the `admins:` of xce.yaml
  (users, and "@group" for a group's members);
- everyone may list everyone's jobs; with `visibility: summary` a job one may not act on is shown
  without its command line, environment, cwd and output paths (`redact`);
- a queue with `users:` or `groups:` takes jobs from those only (and from admins).
A refusal names the action, the job, and who may do it instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ACTIONS = ("kill", "hold", "release", "requeue", "suspend", "resume", "peek", "why", "details")
PROJECT_VIEW = "project:view"
# What `visibility: summary` hides of a job one may not see in full (api/wire.py's keys): its command
# line, cwd, output paths, and what may hold its environment or data (effective values, app params).
HIDDEN = ("command", "cwd", "stdout", "stderr", "env", "effective", "app_params", "meta")


@dataclass(frozen=True)
class Who:
    """A caller as the kernel said (SO_PEERCRED): uid, name, and the names of its groups."""

    user: str
    uid: int
    groups: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Policy:
    """The configuration the rules read. `owner_uid`: the uid the controller runs as."""

    owner_uid: int
    shared: bool = False
    admins: frozenset[str] = frozenset()  # user names
    admin_groups: frozenset[str] = frozenset()  # group names (written "@group" in xce.yaml)
    project_admins: Mapping[str, frozenset[str]] = field(default_factory=dict)  # project path -> admins
    visibility: str = "full"

    @classmethod
    def of(cls, owner_uid: int, shared: bool, admins: Iterable[str], projects: Mapping[str, Iterable[str]],
           visibility: str = "full") -> Policy:
        """From xce.yaml's words: `admins` may hold "@group" entries, as may a project's."""
        names = tuple(admins)
        return cls(owner_uid, shared, frozenset(a for a in names if not a.startswith("@")),
                   frozenset(a[1:] for a in names if a.startswith("@")),
                   {path: frozenset(who) for path, who in projects.items() if who}, visibility)


def policy_of(config: Any, owner_uid: int) -> Policy:
    """The policy of a cluster's configuration (config/cluster.ClusterConfig)."""
    return Policy.of(owner_uid, config.mode == "shared", config.admins,
                     {p.name: p.admins for p in config.projects}, config.visibility)


def is_admin(who: Who, policy: Policy) -> bool:
    if who.uid == 0 or who.uid == policy.owner_uid:
        return True
    return policy.shared and (who.user in policy.admins or not policy.admin_groups.isdisjoint(who.groups))


def project_admin(who: Who, project: str | None, policy: Policy) -> str | None:
    """The project (this one or an ancestor) whose admins `who` is one of, or None."""
    if project is None:
        return None
    parts = project.split("/")
    for depth in range(len(parts), 0, -1):
        path = "/".join(parts[:depth])
        admins = policy.project_admins.get(path, frozenset())
        if who.user in admins or any(f"@{g}" in admins for g in who.groups):
            return path
    return None


def may(action: str, who: Who, owner: str, project: str | None, policy: Policy) -> bool:
    """May `who` do `action` to a job of `owner` in `project`? (`project:view`: see its usage.)"""
    if action != PROJECT_VIEW and action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    if is_admin(who, policy) or project_admin(who, project, policy) is not None:
        return True
    return action != PROJECT_VIEW and who.user == owner


def sees_in_full(who: Who, owner: str, project: str | None, policy: Policy) -> bool:
    return policy.visibility == "full" or may("details", who, owner, project, policy)


def who_may(owner: str | None, project: str | None, policy: Policy) -> str:
    """The words for who may act on a job of `owner` in `project`: its owner, the admins, and the
    admins of its project and of each ancestor of it."""
    named = ["root"] + sorted(policy.admins) + [f"members of group {g}" for g in sorted(policy.admin_groups)]
    words = [f"its owner {owner}"] if owner is not None else []
    words.append("the cluster's admins (" + ", ".join(named) + ")" if policy.shared
                 else "the cluster's owner or root")
    if project is not None:
        parts = project.split("/")
        for depth in range(len(parts), 0, -1):
            path = "/".join(parts[:depth])
            admins = policy.project_admins.get(path)
            if admins:
                words.append(f"the admins of project {path} ({', '.join(sorted(admins))})")
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def refusal(action: str, who: Who, job: str, owner: str, project: str | None, policy: Policy) -> str:
    """What a refused action says: what was refused, whose the job is, who may do it."""
    return (f"{who.user} may not {action} job {job}: it belongs to {owner}"
            + (f" (project {project})" if project else "")
            + f"; only {who_may(owner, project, policy)} may")


def may_submit(who: Who, queue: str, users: Iterable[str] | None, groups: Iterable[str] | None,
               policy: Policy) -> str | None:
    """None if `who` may submit to `queue`, else why not (naming who may)."""
    if users is None and groups is None:
        return None
    users, groups = frozenset(users or ()), frozenset(groups or ())
    if who.user in users or not groups.isdisjoint(who.groups) or is_admin(who, policy):
        return None
    allowed = [f"users {', '.join(sorted(users))}"] if users else []
    allowed += [f"members of group(s) {', '.join(sorted(groups))}"] if groups else []
    return (f"queue {queue} takes jobs only from {' and '.join(allowed)} (and the cluster's admins); "
            f"{who.user} is not one of them: submit to another queue (`xce queues`) or ask an admin to add you")


def redact(job: dict) -> dict:
    """A wire job without what `visibility: summary` hides from others."""
    shown = {key: value for key, value in job.items() if key not in HIDDEN}
    shown["hidden"] = sorted(key for key in HIDDEN if key in job)
    return shown
