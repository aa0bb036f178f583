"""Checks of a configuration beyond its schema, the same at `xceadmin check`, controller start and
`xce reconfig`.

Errors (the configuration is refused): unfinished jobs in a queue the configuration no longer has
(they could not be scheduled, launched or shown), and a renamed cluster (its name is in every unit
name). Schema errors and an undefined `default_application` are raised by the loaders already.
Warnings (it is used, and the warnings are printed or logged): secret-looking env names in a
profile, a profile whose select matches no host, and, against the configuration that runs now,
which pending jobs' effective values would change.
Pure over loaded values: the callers read the files and the store.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.merge_values import Effective, Profile
from xce_lite.config.merge_view import changed_fields
from xce_lite.config.profiles import looks_secret
from xce_lite.config.sched_view import effective, host_totals
from xce_lite.errors import SpecError
from xce_lite.models import FINISHED_STATES, PENDING_STATES, Job
from xce_lite.sched import resreq as rr
from xce_lite.sched.placement import attributes

Setup = tuple[ClusterConfig, dict[str, Profile]]
# The store's meta key under which the controller keeps the text of the configuration it runs on
# ({"xce.yaml": text, "applications.yaml": text or null}), for `xceadmin check`.
RUNNING_CONFIG_META = "running_config"


@dataclass
class Review:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # pending jobs whose effective values change: {"id", "fields": [...], "refused": reason or None}
    changes: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"errors": self.errors, "warnings": self.warnings, "changes": self.changes}


def review(new: Setup, jobs: Iterable[Job], running: Setup | None = None) -> Review:
    """Everything the module docstring lists; `running` is the configuration in use (None: none)."""
    config, profiles = new
    jobs = list(jobs)
    result = Review(warnings=warnings(config, profiles))
    queues = {q.name for q in config.queues}
    stranded: dict[str, int] = {}
    for job in jobs:
        if job.state not in FINISHED_STATES and job.queue not in queues:
            stranded[job.queue] = stranded.get(job.queue, 0) + 1
    result.errors.extend(f"queue {name} still has {n} unfinished job(s); keep the queue until they finish "
                         f"(or kill them)" for name, n in sorted(stranded.items()))
    if running is not None:
        if running[0].cluster != config.cluster:
            result.errors.append(f"the cluster name changed from {running[0].cluster} to {config.cluster}; it is part "
                                 f"of every unit name: put it back (rename only a cluster with no jobs, and restart)")
        result.changes = pending_changes([j for j in jobs if j.state in PENDING_STATES], running, new)
    return result


def warnings(config: ClusterConfig, profiles: dict[str, Profile]) -> list[str]:
    found = []
    views = host_totals(config)
    for name, profile in sorted(profiles.items()):
        secret = sorted(k for k in profile.env if looks_secret(k))
        if secret:
            found.append(f"application {name}: env {', '.join(secret)} looks like a secret; every user can read "
                         f"a profile (`xce apps -l`): keep secrets in files only their owners can read")
        select = profile.resources.select
        if select is not None and not any(rr.evaluate(select, attributes(v)) for v in views):
            found.append(f"application {name}: select[{rr.format_expr(select)}] matches no host; its jobs would "
                         f"be refused at submit")
    return found


def pending_changes(jobs: Iterable[Job], before: Setup, after: Setup) -> list[dict]:
    """Pending jobs whose effective values differ between two configurations, with the fields."""
    changes = []
    for job in jobs:
        old, _ = _effective(job, before)
        new, refused = _effective(job, after)
        fields = changed_fields(old, new)
        if fields or (refused and old is not None):
            changes.append({"id": job.id, "fields": fields, "refused": refused})
    return changes


def _effective(job: Job, setup: Setup) -> tuple[Effective | None, str | None]:
    try:
        return effective(job.spec, job.queue, *setup), None
    except SpecError as err:
        return None, str(err)
