"""The controller's side of shared mode (issue 16) and of the permissions of every mode.

A part of the controller (`Controller.access`), given the shared state, the store and how job
references expand (gating.py). What it keeps:
- every route sees its caller with `admin` decided by the configuration in use (permissions.py);
  the routes that act on jobs check, before their handler runs, that the caller may do that to
  every job named (its owner, an admin, an admin of its project or an ancestor); the listings
  show others' jobs per `visibility`;
- in shared mode the controller runs as root; each job runs as its submitter: the submit stamps
  the caller's kernel identity (uid, gid, and the group database's groups of that name) into the
  spec's exdata `run_as` (a client cannot send that key: models.py refuses it), which becomes the
  launch's user (jobunits.py); the job's cwd and output directories are checked at submit with
  the submitter's own permissions (useraccess.py), and its queue's `users:`/`groups:`;
- with `visibility: summary` a user's `xce acct` shows their own usage, or a project's they hold
  `project:view` on (project admins);
- in shared mode a host whose agent cannot run jobs as other users (not root there) gets no work.
Personal mode is unchanged: admins are root and the controller's user; jobs carry no `run_as`.
"""

from __future__ import annotations

import grp
import pwd
import time
from dataclasses import replace
from collections.abc import Callable
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.config.cluster import ClusterConfig
from xce_lite.controller import permissions, useraccess
from xce_lite.controller.permissions import policy_of  # noqa: F401 (its old home)
from xce_lite.controller.state import ControllerState
from xce_lite.models import Job, JobSpec

# Routes that act on jobs named in their body ("ids") or query ("id"), and the action each is.
ACTIONS = {
    ("POST", "/jobs/kill"): "kill", ("POST", "/jobs/hold"): "hold", ("POST", "/jobs/release"): "release",
    ("POST", "/jobs/suspend"): "suspend", ("POST", "/jobs/resume"): "resume",
    ("POST", "/jobs/requeue"): "requeue", ("GET", "/jobs/peek"): "peek", ("GET", "/jobs/why"): "why",
}
USAGE = ("GET", "/accounting/summary")  # usage: its own user's, or project:view (`_usage_query`)
ACCESS_KEPT = 5.0  # seconds a passed directory check is trusted for the same user and directories
Handler = Callable[[Caller, dict, Any], Any]  # a route's handler: (caller, query, body) -> reply
LISTINGS = {("GET", "/jobs"), ("GET", "/jobs/wait"), ("GET", "/jobs/history")}  # jobs shown per `visibility`


def shared_problem(config: ClusterConfig, euid: int) -> str | None:
    """Why this process cannot be the controller of `config`, or None."""
    if config.mode == "shared" and euid != 0:
        return ("this home is shared (`mode: shared` in xce.yaml): its controller runs as root, so that each "
                "job runs as the user who submitted it; start it as root (`sudo xce controller start`, or the "
                "systemd unit `xce controller unit` prints), or set `mode: personal`")
    return None


def mode_change_problem(running: ClusterConfig, new: ClusterConfig) -> str | None:
    """Why `xce reconfig` cannot apply `new` live: the mode and the socket's group are set at start
    (a personal controller run as root behind a socket left open to all would run everyone's jobs
    as root)."""
    if (running.mode, running.socket_group) != (new.mode, new.socket_group):
        return ("mode and socket_group change only with a restart of the controller "
                "(`xce controller stop`, then start it again); nothing was changed")
    return None


def socket_mode(config: ClusterConfig) -> tuple[int, int | None]:
    """The API socket's mode and group: 0600 personal; shared 0666, or 0660 for `socket_group`."""
    if config.mode != "shared":
        return 0o600, None
    if config.socket_group is None:
        return 0o666, None
    return 0o660, grp.getgrnam(config.socket_group).gr_gid


class Access:
    """See the module docstring. The configuration, its permission policy and the hosts' probes are
    read from `state`; `expand_refs` turns a request's job references into (label, ids, whole)."""

    def __init__(self, state: ControllerState, store: Any,
                 expand_refs: Callable[[list], list[tuple[str, list[int], bool]]]) -> None:
        self.state, self.store, self.expand_refs = state, store, expand_refs
        self.access_checked: dict[tuple, float] = {}  # (who, directories) -> when its check passed
        # The last connection's caller as identified: (its Caller as the API made it, the policy it
        # was judged under, the identified Caller, its Who). A kept-alive connection sends its
        # Caller object with every request: the group database is read and the admin rule applied
        # once per connection and policy, and the identified object stays the same, so that what
        # is remembered per caller object (projects.py: its groups from /proc) is reused too.
        # Compared by identity: a later connection is never taken for an earlier one.
        self._identified: tuple[Caller, object, Caller, permissions.Who] | None = None
        self._stamped: tuple[JobSpec, tuple, JobSpec] | None = None  # as_submitter's last (spec, caller, result)

    # ---- who calls ------------------------------------------------------------------------------

    def who(self, caller: Caller) -> permissions.Who:
        memo = self._identified
        if memo is not None and (memo[2] is caller or memo[0] is caller):
            return memo[3]
        return permissions.Who(caller.user, caller.uid, frozenset(_group_names(caller)))

    def identified(self, caller: Caller) -> Caller:
        policy = self.state.permission_policy
        memo = self._identified
        if memo is not None and memo[0] is caller and memo[1] is policy:
            return memo[2]
        who = self.who(caller)
        found = replace(caller, admin=permissions.is_admin(who, policy))
        self._identified = (caller, policy, found, who)  # one assignment: API workers read it at once
        return found

    def may_act(self, caller: Caller, job: Job, action: str = "details") -> bool:
        return permissions.may(action, self.who(caller), job.user, job.project, self.state.permission_policy)

    def act_refusal(self, caller: Caller, job: Job, action: str) -> str:
        return permissions.refusal(action, self.who(caller), job.display_id, job.user, job.project,
                                   self.state.permission_policy)

    # ---- the route table ------------------------------------------------------------------------

    def permitted(self, route: tuple[str, str], handler: Handler) -> Handler:
        """`handler` behind the permission rules of its route (see the module docstring)."""
        action = ACTIONS.get(route)
        listing = route in LISTINGS

        def guarded(caller: Caller, query: dict, body: Any) -> Any:
            caller = self.identified(caller)
            if action is not None and not caller.is_admin:
                for job in self.named_jobs(query, body):
                    if not self.may_act(caller, job, action):
                        raise errors.TransitionError(self.act_refusal(caller, job, action))
            if route == USAGE and not caller.is_admin:
                query = self.usage_query(caller, query)
            reply = handler(caller, query, body)
            policy = self.state.permission_policy
            if listing and "jobs" in reply and not caller.is_admin and policy.visibility != "full":  # (brief: counts)
                who = self.who(caller)
                reply["jobs"] = [job if permissions.sees_in_full(who, job["user"], job.get("project"), policy)
                                 else permissions.redact(job) for job in reply["jobs"]]
            return reply
        return guarded

    def usage_query(self, caller: Caller, query: dict) -> dict:
        """`xce acct` on a shared cluster with `visibility: summary`: one's own usage (the default
        then, as LSF's bacct), or with -P a project one holds `project:view` on (its admins and
        their ancestors'); anyone's for the admins. Elsewhere: everyone's, as before."""
        policy = self.state.permission_policy
        if not policy.shared or policy.visibility == "full":
            return query
        who, project, user = self.who(caller), query.get("project") or None, query.get("user") or None
        if project is not None and permissions.may(permissions.PROJECT_VIEW, who, "", project, policy):
            return query
        if user is None:
            return {**query, "user": caller.user}
        if user == caller.user:
            return query
        raise errors.TransitionError(
            f"{caller.user} may not see the usage of {'everyone' if user == 'all' else user}: this cluster shows "
            f"usage to its own user, to {permissions.who_may(None, project, policy)} (project:view); "
            f"see yours with `xce acct -u {caller.user}`")

    def named_jobs(self, query: dict, body: Any) -> list[Job]:
        """The jobs a request names (an array's elements for an array); none if it names them badly
        (the handler then says what is wrong)."""
        refs = body.get("ids") if isinstance(body, dict) else None
        if refs is None and query.get("id"):
            refs = [part for part in query["id"].split(",") if part.strip()]
        if not isinstance(refs, list) or not all(isinstance(r, (int, str)) and not isinstance(r, bool)
                                                 for r in refs):
            return []
        try:
            expanded = self.expand_refs(refs)
        except errors.XceError:
            return []
        ids = list(dict.fromkeys(i for _label, job_ids, _whole in expanded for i in job_ids))
        return self.store.jobs(ids) if ids else []

    def owned(self, caller: Caller, ids: list[int]) -> list[Job]:
        """The jobs `ids` (all of them, or NotFound), each one the caller may act on (or TransitionError)."""
        if not ids:
            raise errors.SpecError("name at least one job id")
        jobs = {j.id: j for j in self.store.jobs(ids)}
        missing = [i for i in ids if i not in jobs]
        if missing:
            raise errors.NotFound(f"no such job: {', '.join(map(str, missing))}")
        foreign = [i for i in ids if not caller.is_admin and not self.may_act(caller, jobs[i])]
        if foreign:  # the route table checked the action already (shared.py); this is the last guard
            raise errors.TransitionError(self.act_refusal(caller, jobs[foreign[0]], "act on"))
        return [jobs[i] for i in ids]

    # ---- submit ---------------------------------------------------------------------------------

    def as_submitter(self, spec: JobSpec, queue_name: str, caller: Caller | None) -> JobSpec:
        """The spec as the caller may submit it: its queue's ACL checked; in shared mode its paths
        checked with the caller's own permissions and `run_as` set from the caller's identity.
        SpecError naming the queue or the path and the user otherwise."""
        if caller is None:
            return spec
        queue = self.state.config.queue(queue_name)
        why = permissions.may_submit(self.who(caller), queue.name, queue.users, queue.groups,
                                     self.state.permission_policy)
        if why is not None:
            raise errors.SpecError(why)
        if self.state.config.mode != "shared":
            return spec
        try:
            pwd.getpwnam(caller.user)
        except KeyError:
            raise errors.SpecError(f"uid {caller.uid} has no name in this machine's user database; a shared cluster "
                                   f"runs each job as its named user: ask an admin to add one") from None
        # groups: the group database's list for the name (as initgroups makes it), read at submit
        run_as = {"name": caller.user, "uid": caller.uid, "gid": caller.gid, "groups": list(caller.groups)}
        key = (caller.uid, caller.gid, caller.groups, spec.cwd, *useraccess.output_dirs(spec))
        now = time.monotonic()
        checked = self.access_checked
        if now - checked.get(key, -ACCESS_KEPT) >= ACCESS_KEPT:  # a flow's or a burst's steps: checked once
            useraccess.check_paths(spec, caller.user, caller.uid, caller.gid, caller.groups)
            if len(checked) > 1024:
                checked.clear()
            checked[key] = now
        stamp = (caller.user, caller.uid, caller.gid, caller.groups)
        last = self._stamped  # submits alike keep one spec object (the store encodes it once, accept
        if last is not None and last[0] is spec and last[1] == stamp:  # keeps its merge); identity:
            return last[2]  # the spec is kept, so its id stays its own
        stamped = replace(spec, exdata={**spec.exdata, "run_as": run_as})
        self._stamped = (spec, stamp, stamped)
        return stamped

    # ---- hosts ----------------------------------------------------------------------------------

    def refused_hosts(self) -> dict[str, str]:
        """Hosts shared mode gives no work: their agent cannot run jobs as other users. Holds _mu."""
        if self.state.config.mode != "shared":
            return {}
        refused = {}
        for name, probe in self.state.probes.items():
            extra = getattr(probe, "extra", None) or {}
            if extra.get("can_switch_user") is False:
                why = extra.get("can_switch_user_why") or "not root"
                refused[name] = (f"its agent cannot run jobs as their users ({why}); "
                                 "a shared cluster's agents run as root: set the host's `user: root` in xce.yaml "
                                 "(and root's SSH key there), then `xce reconfig`")
        return refused


def store_refusal(handler: Handler) -> Handler:
    """The handler, with a store that cannot take its write turned into a plain refusal: exit 4 at
    the client (errors.StoreError), saying what is wrong and that the request was not carried out."""
    def guarded(caller: Caller, query: dict, body: Any) -> Any:
        try:
            return handler(caller, query, body)
        except errors.StoreUnavailable as err:
            raise errors.StoreError(f"{err}; the request was not carried out (nothing of it was stored); "
                                    "the controller runs on and retries by itself: try again when "
                                    "`xce controller status` shows no store problem") from None
    return guarded


def _group_names(caller: Caller) -> list[str]:
    names = []
    for gid in (caller.gid, *caller.groups):
        if gid < 0:
            continue
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            names.append(str(gid))
    return names
