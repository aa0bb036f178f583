"""The controller's configuration: the one in use, a new one applied live (`xce reconfig`), and the
API routes that show it: application profiles (`/apps`) and admin presets (`/presets`).

What a reconfig keeps:
- A configuration with errors (schema, an undefined default application, a queue removed while it
  still has jobs, a renamed cluster) is refused whole: nothing changes.
- Pending jobs are merged again at once (their effective values are live); dispatched and running
  jobs keep the effective values stored at their dispatch. A scheduling session already under way
  may decide on the old values: dispatching.py then declines the dispatch and the job stays PEND.
- Queues, profiles, defaults, the controller's settings and hosts' totals, attributes and tags
  apply at once. A host removed is closed to new work (its running jobs go on); a host added is
  connected, and one whose connection settings changed is reconnected (the controller's
  `_hosts_changed`, passed in).
The running configuration's text is kept in the store's meta, so `xceadmin check` can say what a
restart with the files as they are would change, with or without a running controller.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.config.checks import RUNNING_CONFIG_META, review
from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.merge import Profile
from xce_lite.config.merge_view import describe_profile
from xce_lite.config.presets import PresetDir
from xce_lite.config.profiles import applications_path, load_cluster
from xce_lite.controller.gating import Gating
from xce_lite.controller.pool_views import PoolViews
from xce_lite.controller.projects import ProjectShares
from xce_lite.controller.seams import Clock
from xce_lite.controller.shared import Handler, mode_change_problem, shared_problem
from xce_lite.controller.state import ControllerState
from xce_lite.home.paths import Home
from xce_lite.models import PEND


def check_config(config: ClusterConfig, profiles: dict[str, Profile], store: Any, log: Callable[[str], None]) -> None:
    """At start: errors refuse it (ConfigError, the controller does not start); warnings are logged."""
    result = review((config, profiles), store.unfinished())
    problem = shared_problem(config, os.geteuid())  # shared.py: a shared home's controller is root
    if result.errors or problem:
        raise errors.ConfigError("\n".join(result.errors + ([problem] if problem else []))
                                 + "\nfix the configuration, then start again")
    for warning in result.warnings:
        log(f"config warning: {warning}")


def use_config(state: ControllerState, pool_views: PoolViews, store: Any, home: Home, config: ClusterConfig,
               profiles: dict[str, Profile], now: float) -> None:
    """Make `config` the one in use, with all that is derived from it (the caller holds the lock once
    the controller runs), and keep its text in the store."""
    state.use(config, profiles)  # state.py: totals, addresses, policies, projects
    pool_views.refresh(now)  # pool_views.py: the pools' hosts, which come and go
    texts: dict[str, str | None] = {}
    for path in (home.config, applications_path(home.config)):
        try:
            texts[path.name] = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            texts[path.name] = None
    store.set_meta(RUNNING_CONFIG_META, json.dumps(texts))


class ConfigRoutes:
    """See the module docstring. A part of the controller (`Controller.config_api`), given the shared
    state, the store, the home, the clock, the log, the parts a reconfig brings up to date (pool
    views, gating, projects) and how the Controller reconnects hosts (`hosts_changed(old, new)`)."""

    def __init__(self, state: ControllerState, store: Any, home: Home, clock: Clock, log: Callable[[str], None],
                 pool_views: PoolViews, gating: Gating, projects: ProjectShares,
                 hosts_changed: Callable[[ClusterConfig, ClusterConfig], None]) -> None:
        self.state, self.store, self.home, self.clock, self.log = state, store, home, clock, log
        self.pool_views, self.gating, self.projects, self.hosts_changed = pool_views, gating, projects, hosts_changed
        self.presets = PresetDir(home.presets)

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("GET", "/apps"): self.api_apps,
            ("POST", "/controller/reconfig"): self.api_reconfig,
            ("GET", "/presets"): self.api_presets,
        }

    def reconfigure(self, dry_run: bool = False) -> dict[str, Any]:
        """Read the configuration files again and apply them live (see the module docstring);
        ConfigError, with nothing changed, if they have errors. `dry_run`: only say what would change."""
        new = load_cluster(self.home.config)
        with self.state.mu:
            running = (self.state.config, self.state.profiles)
        jobs = self.store.unfinished()
        result = review(new, jobs, running)
        for problem in (shared_problem(new[0], os.geteuid()), mode_change_problem(running[0], new[0])):
            if problem:
                result.errors.append(problem)
        if result.errors:
            raise errors.ConfigError("\n".join(result.errors) + "\nnothing was changed; fix the configuration "
                                     "and run `xce reconfig` again")
        if not dry_run:
            with self.state.mu:
                use_config(self.state, self.pool_views, self.store, self.home, *new, self.clock.time())
                self.gating.templates.clear()  # an array's merge is made again with the new configuration
                pending = self.state.pending
                for job in jobs:
                    if job.state == PEND and job.id in pending:
                        pending.add(self.gating.pending_job(job.id, job.user, job.queue, job.spec, job.submit_time))
                self.projects.fair_books(self.clock.time())
                self.state.dirty = True
            self.projects.hold_outside(jobs)
            self.hosts_changed(running[0], new[0])
            self.state.wake.set()
            self.log(f"reconfigured: {len(result.changes)} pending job(s) see new effective values")
        return {**result.to_json(), "applied": not dry_run}

    # ---- the routes -------------------------------------------------------------------------

    def api_apps(self, caller: Caller, query: dict, body: Any) -> dict:
        with self.state.mu:
            profiles, default = self.state.profiles, self.state.config.default_application
        return {"schema": 1, "default": default, "apps": [
            {"name": p.name, "description": p.description, "kind": p.kind, "hash": p.hash,
             "default": p.name == default, "fields": describe_profile(p)}
            for _, p in sorted(profiles.items())]}

    def api_reconfig(self, caller: Caller, query: dict, body: Any) -> dict:
        if not caller.is_admin:
            raise errors.TransitionError("only the cluster's admins (or its owner, or root) may reconfigure the "
                                         "controller")
        return self.reconfigure(dry_run=query.get("dry_run", "").lower() in ("1", "true", "yes"))

    def api_presets(self, caller: Caller, query: dict, body: Any) -> dict:
        """The admin presets in <home>/config/presets, as the files are now; `name` picks one."""
        presets, problems = self.presets.read()
        name = query.get("name")
        if name is not None:
            presets = [p for p in presets if p.name == name]
            if not presets:
                raise errors.NotFound(f"the cluster has no preset {name!r}; see `xce preset list --server`")
        return {"schema": 1, "cluster": self.state.cluster, "problems": problems,
                "presets": [dict(p.to_json(), hash=p.hash) for p in presets]}
