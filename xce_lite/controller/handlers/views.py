"""The controller's API routes that read: status, jobs, wait, hosts, why, peek, queues (`xce jobs`,
`xce hosts`, `xce why`, ...), and the two that ask the controller itself: reconnect, stop.

A part of the controller (`Controller.views`), given the shared state, the store, the home, the
parts it reads (gating, projects, pool views, faults, the access rules, the hosts in trouble), what
is free on the hosts now (`hosts_now`, `shared_free`), and the Controller's `stop` and the API
server's counters (`server_stats`). It reads under the lock and never changes a job; peek reads
a piece of an output file through the job's host's agent.
"""

from __future__ import annotations

import base64
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.api.wire import job_to_wire
from xce_lite.config.merge import Effective
from xce_lite.config.merge_view import describe
from xce_lite.config.sched_view import effective
from xce_lite.controller.faults import Faults
from xce_lite.controller.gating import Gating
from xce_lite.controller.handlers.wait_brief import brief_lists, brief_reply
from xce_lite.controller.host_trouble import HostTrouble
from xce_lite.controller.pool_views import PoolViews
from xce_lite.controller.projects import ProjectShares
from xce_lite.controller.shared import Access, Handler
from xce_lite.controller.state import ControllerState
from xce_lite.controller.wait_ended import wait_ended
from xce_lite.home.paths import Home
from xce_lite.models import DISP, DONE, EXIT, PEND, PENDING_STATES, Job
from xce_lite.sched.placement import HostView, JobRequest, place
from xce_lite.sched.prefill import queued_reason
from xce_lite.sched.reasons import FrozenMap, Refusal


class JobViews:
    """See the module docstring."""

    def __init__(self, state: ControllerState, store: Any, home: Home, started_at: float, gating: Gating,
                 projects: ProjectShares, pool_views: PoolViews, faults: Faults, access: Access, trouble: HostTrouble,
                 hosts_now: Callable[[], tuple[HostView, ...]], shared_free: Callable[[], FrozenMap],
                 stop: Callable[[], None], server_stats: Callable[[], dict | None]) -> None:
        self.state, self.store, self.home, self.started_at = state, store, home, started_at
        self.gating, self.projects, self.pool_views, self.faults = gating, projects, pool_views, faults
        self.access, self.trouble, self.hosts_now, self.shared_free = access, trouble, hosts_now, shared_free
        self.stop, self.server_stats = stop, server_stats

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("GET", "/status"): self.api_status,
            ("GET", "/jobs"): self.api_jobs,
            ("GET", "/jobs/wait"): self.api_wait,
            ("GET", "/hosts"): self.api_hosts,
            ("POST", "/hosts/reconnect"): self.api_reconnect,
            ("GET", "/jobs/why"): self.api_why,
            ("GET", "/jobs/peek"): self.api_peek,
            ("GET", "/queues"): self.api_queues,
            ("POST", "/controller/stop"): self.api_stop,
        }

    def api_status(self, caller: Caller, query: dict, body: Any) -> dict:
        with self.state.mu:
            waiting = len(self.gating.gate) - len(self.gating.gate.fed)  # pending, not yet the scheduler's to place
            state = self.state
            counts = {"pending": len(state.pending) + waiting, "held": len(state.held), "active": len(state.active)}
            faults = self.faults.status()
        return {"cluster": self.state.cluster, "pid": os.getpid(), "home": str(self.home.root),
                "started_at": self.started_at, "jobs": counts, "you": caller.user, **faults,
                "api": self.server_stats()}  # connections, workers, refusals

    def api_jobs(self, caller: Caller, query: dict, body: Any) -> dict:
        """Jobs, and arrays summed up (one entry each, with their elements' count by state); an
        array's elements too with `elements`. `ids`: jobs, arrays (42) and elements (42[7])."""
        refs = self.gating.expand_refs([part for part in query.get("ids", "").split(",") if part.strip()])
        user = query.get("user")
        if user == "all":
            user = None
        elif user is None and not refs:
            user = caller.user
        include_finished = _flag(query, "all")
        elements = _flag(query, "elements")
        project = query.get("project") or None
        if refs:
            array_ids = [int(label) for label, _ids, whole in refs if whole]
            job_ids = [i for _label, ids, whole in refs if not whole or elements for i in ids]
            jobs = self.store.jobs(job_ids) if job_ids else []
            summaries = self.store.array_summaries(array_ids) if array_ids else []
        else:
            jobs = self.store.jobs(None, user=user, include_finished=include_finished, elements=elements,
                                   project=project)
            summaries = [s for s in self.store.array_summaries(user=user, include_finished=include_finished)
                         if project is None or s.get("project") == project]
        wired = self.to_wire(jobs, _flag(query, "effective"))
        if _flag(query, "history"):  # every attempt's events: dispatched, started, requeued (a retry), ...
            for job in wired:
                job["history"] = [{"time": t, "kind": kind, "data": data}
                                  for t, kind, data in self.store.events(job["id"])]
        return {"schema": 1, "jobs": wired, "arrays": self._queued_as_pending(summaries) if summaries else summaries}

    def to_wire(self, jobs: list[Job], with_effective: bool = False) -> list[dict]:
        """Jobs as the API shows them: pend reasons are the live ones (the store's may lag a second);
        task counts are the effective ones. `with_effective`: each job's effective values, as rows
        (field, value, origin): those fixed at dispatch, or the live ones while it waits."""
        wired = []
        for j in jobs:
            job = job_to_wire(j)
            eff: Effective | str | None = None
            if j.effective and not with_effective:  # the task counts alone: no Effective built per job
                tasks: tuple[int, int] | None = (j.effective["min_tasks"], j.effective["max_tasks"])
            else:
                eff = self._job_effective(j)
                tasks = (eff.min_tasks, eff.max_tasks) if isinstance(eff, Effective) else None
            if tasks is not None:
                job.update(min_slots=tasks[0], max_slots=tasks[1])
                if not j.hosts:
                    job["slots"] = tasks[0]
            if with_effective:
                job["effective"] = describe(eff) if isinstance(eff, Effective) else []
                job["effective_problem"] = eff if isinstance(eff, str) else None
                job["fairshare"] = self.projects.fair_standing(j) if j.state in PENDING_STATES else None
            wired.append(job)
        with self.state.mu:
            for job in wired:
                if job["state"] == PEND and job["id"] in self.state.reasons:
                    job["pend_reason"] = self.state.reasons[job["id"]]
                # a queued successor (prefilling.py), DISP on its host behind a running job, has not
                # started: users see it PEND (as LSF and Slurm users expect), with the reason the
                # session gave it, and where it waits
                behind = self.state.behind.get(job["id"]) if job["state"] == DISP else None
                job["queued_behind"] = behind
                if behind is not None:
                    job["state"] = PEND
        return wired

    def _queued_as_pending(self, summaries: list[dict]) -> list[dict]:
        """Arrays' counts by state with their queued successors counted PEND (to_wire)."""
        by_id = {s["id"]: s for s in summaries}
        with self.state.mu:
            for job_id in self.state.behind:
                active = self.state.active.get(job_id)
                states = by_id[active.array_id]["states"] if active and active.array_id in by_id else None
                if states and states.get(DISP):
                    states[DISP] -= 1
                    states[PEND] = states.get(PEND, 0) + 1
                    if not states[DISP]:
                        del states[DISP]
        return summaries

    def _job_effective(self, job: Job) -> Effective | str | None:
        """Fixed at dispatch, else live for a waiting job; the reason when it cannot be merged now."""
        if job.effective:
            return Effective.from_json(job.effective)
        if job.state not in PENDING_STATES:
            return None  # ended before it was dispatched, or dispatched before schema 4
        try:
            return effective(job.spec, job.queue, self.state.config, self.state.profiles)
        except errors.SpecError as err:
            return str(err)

    def api_wait(self, caller: Caller, query: dict, body: Any) -> dict:
        """Block until every job named has finished, or `timeout` seconds; long-poll for `xce wait`.
        With `brief=1` the reply counts the jobs per state instead of listing them (`xce wait -q`):
        the records of a 1,000-element array took ~70 ms to read, encode and send (wait_brief.py:
        what else such a reply may list)."""
        refs = self.gating.expand_refs([part for part in query.get("ids", "").split(",") if part.strip()])
        ids = [i for _label, job_ids, _whole in refs for i in job_ids]
        if not ids:
            raise errors.SpecError("name at least one job id to wait for")
        try:
            timeout = min(float(query.get("timeout", 30)), 300.0)
        except ValueError:
            raise errors.SpecError(f"timeout must be a number of seconds, not {query.get('timeout')!r}") from None
        if timeout != timeout:  # NaN
            raise errors.SpecError("timeout must be a number of seconds, not NaN")
        listed, singles = brief_lists(query)
        deadline = time.monotonic() + timeout
        with self.state.mu:
            state, gate = self.state, self.gating.gate
            wait_ended(state.finished, ids, lambda i: i in state.pending or i in gate or i in state.held
                       or i in state.active, deadline, state.waited)  # linear in the ids (wait_ended.py)
        if _flag(query, "brief"):
            return brief_reply(self.store, self.to_wire, ids, listed, singles)
        jobs = self.store.jobs(ids)
        finished = all(j.state in (DONE, EXIT) for j in jobs)
        return {"schema": 1, "finished": finished, "jobs": self.to_wire(jobs)}

    def api_hosts(self, caller: Caller, query: dict, body: Any) -> dict:
        """Each host: state (ok, or unreach with since when), how it runs jobs, and per resource its
        total, what jobs reserve, what is free."""
        with self.state.mu:
            views = self.hosts_now()
            running: dict[str, int] = defaultdict(int)
            for job in self.state.active.values():
                if job.id in self.state.behind:
                    continue  # a queued successor: it waits (to_wire), holding nothing of its own
                for host, _tasks in job.hosts:
                    running[host] += 1
            probes, since, why = dict(self.state.probes), dict(self.state.down_since), dict(self.state.down_why)
            lost, trouble, states = set(self.state.lost_hosts), self.trouble.copy(), dict(self.state.host_state)
            refused = self.access.refused_hosts()  # shared.py: cannot run jobs as their users
        pools = self.pool_views.wire(time.time())
        templates = {p["name"] for p in pools}  # the pools' own entries, never up: see pools.py
        return {"schema": 1, "pools": pools, "hosts": [
            {"name": v.name, "type": v.attrs.get("type"), "state": "ok" if states.get(v.name) == "ok" else "unreach",
             "unreach_since": since.get(v.name), "unreach_why": why.get(v.name), "lost": v.name in lost,
             "trouble": trouble[v.name][0] if v.name in trouble else None,
             "trouble_since": trouble[v.name][1] if v.name in trouble else None,
             "refused": refused.get(v.name),
             "jobs": running[v.name],
             "slots": v.total["slots"], "used": v.total["slots"] - v.free["slots"], "mem": v.total["mem"],
             "resources": {name: {"total": total, "free": v.free[name], "reserved": total - v.free[name]}
                           for name, total in v.total.items()},
             "gpus_free": list(v.gpu_free), "attrs": dict(v.attrs), "tags": sorted(v.tags),
             "agent": _probe_to_wire(probes.get(v.name))}
            for v in views if v.name not in templates]}

    def api_reconnect(self, caller: Caller, query: dict, body: Any) -> dict:
        """Try to reach these hosts now, not at the end of their backoff (a key was just accepted)."""
        names = body.get("names") if isinstance(body, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise errors.SpecError('send {"names": [host, ...]}')
        unknown = [n for n in names if n not in self.state.links]
        if unknown:
            raise errors.NotFound(f"no such host: {', '.join(unknown)} (see `xce hosts`)")
        for name in names:
            self.state.links[name].retry_now()
        return {"reconnecting": names}

    def api_why(self, caller: Caller, query: dict, body: Any) -> dict:
        """Why a pending job waits: the placement tried now, per host and per resource."""
        refs = self.gating.expand_refs([query["id"]]) if query.get("id") else []
        if not refs or len(refs[0][1]) != 1:
            raise errors.SpecError("name a job or an array element: /jobs/why?id=JOBID (or 42[7])")
        job = self.access.owned(caller, refs[0][1])[0]
        with self.state.mu:
            behind = self.state.behind.get(job.id) if job.state == DISP else None
        if behind is not None:  # a queued successor: why a dispatch cannot place it, then where it waits
            reply = self._why_placed(job, f"{queued_reason(job.hosts[0][0], behind)}: starts when it ends")
            return {**reply, "state": PEND}  # as `xce jobs` shows it (to_wire)
        if job.state != PEND:
            return {"id": job.id, "state": job.state, "lines": [f"Job <{job.display_id}> is {job.state}, not pending"
                                                                + (f": {job.reason}" if job.reason else "")]}
        with self.state.mu:
            gated = job.id in self.gating.gate and job.id not in self.gating.gate.fed
            reason = self.state.reasons.get(job.id)
        if gated:  # it is not the scheduler's to place yet
            return {"id": job.id, "state": job.state, "summary": reason or "waiting for its dependency", "lines": []}
        return self._why_placed(job)

    def _why_placed(self, job: Job, queued: str | None = None) -> dict:
        """`api_why`'s reply for a job the scheduler places: the placement tried now. `queued`: it
        is a queued successor, waiting there (the last line); if it fits now, the session's reason."""
        with self.state.mu:
            hosts, shared = self.hosts_now(), self.shared_free()
        eff = self._job_effective(job)
        rows = describe(eff) if isinstance(eff, Effective) else []
        if not isinstance(eff, Effective):
            return {"id": job.id, "state": job.state, "effective": rows,
                    "summary": f"cannot run as configured now: {eff}", "lines": []}
        fair = self.projects.fair_standing(job)
        extra = {"fairshare": fair} if fair is not None else {}
        limited = self.projects.project_room(job, eff)
        if limited is not None:
            return {"id": job.id, "state": job.state, "effective": rows, "summary": limited, "lines": [], **extra}
        request = JobRequest(job.id, eff.min_tasks, eff.max_tasks, eff.resreq)
        hosts, request = self.pool_views.why(job.queue, hosts, request, eff.run_limit)  # pools.py
        result = place(request, hosts, shared)
        if not isinstance(result, Refusal) and queued is not None:  # (a queue limit, say: the hosts have room)
            return {"id": job.id, "state": job.state, "effective": rows, "summary": job.pend_reason,
                    "lines": [queued], **extra}
        if not isinstance(result, Refusal):
            where = " ".join(f"{n}*{h}" for h, n in result.hosts)
            return {"id": job.id, "state": job.state, "effective": rows,
                    "lines": [f"it fits now ({where}); the scheduler will start it at its next session"], **extra}
        return {"id": job.id, "state": job.state, "effective": rows, "summary": self.pool_views.words(result.summary()),
                "lines": [self.pool_views.words(line) for line in result.details()] + ([queued] if queued else []),
                **extra}

    def api_peek(self, caller: Caller, query: dict, body: Any) -> dict:
        """A piece of a job's output file, read on its first host through the agent (shared file
        systems are common, not assumed): `offset` where to start, `stream` out or err."""
        ids = _ids(query.get("id", ""))
        if len(ids) != 1:
            raise errors.SpecError("name one job: /jobs/peek?id=JOBID")
        job = self.access.owned(caller, ids)[0]
        stream = query.get("stream", "out")
        if stream not in ("out", "err"):
            raise errors.SpecError(f"stream must be out or err, not {stream!r}")
        path = job.output_path() if stream == "out" else job.error_path()
        if path is None:
            raise errors.SpecError(f"job {job.id} has no error file of its own: its stderr goes to {job.output_path()}")
        if not job.hosts:
            return {"id": job.id, "state": job.state, "data_b64": "", "offset": 0, "eof": True,
                    "message": f"Job <{job.id}> has not started: no output yet"}
        name = job.hosts[0][0]
        host = self.state.hosts.get(name)
        if host is None:
            raise errors.HostUnreachable(f"job {job.id}'s output is on host {name}, which is out of reach; "
                                         "try again when `xce hosts` shows it ok")
        try:
            offset = max(0, int(query.get("offset", 0)))
        except ValueError:
            raise errors.SpecError(f"offset must be a whole number, not {query.get('offset')!r}") from None
        try:
            chunk = host.read(path, offset, 1 << 20)
        except errors.LaunchRejected as err:  # the agent's answer: no such file, or unreadable
            return {"id": job.id, "state": job.state, "data_b64": "", "offset": offset, "eof": True,
                    "message": f"Job <{job.id}>: nothing to show yet ({err})"}
        return {"id": job.id, "state": job.state, "data_b64": base64.b64encode(chunk.data).decode("ascii"),
                "size": chunk.size,  # metrics: the file's size, so that the web can show its tail
                "offset": chunk.offset, "eof": chunk.eof, "path": path, "host": name}

    def api_queues(self, caller: Caller, query: dict, body: Any) -> dict:
        counts = self.store.counts_by_queue()
        default = self.state.config.default_queue.name
        queued: dict[str, int] = defaultdict(int)  # queued successors: stored DISP, shown PEND (to_wire)
        with self.state.mu:
            for job_id in self.state.behind:
                if (active := self.state.active.get(job_id)) is not None:
                    queued[active.queue] += 1
        return {"schema": 1, "queues": [
            {"name": q.name, "priority": q.priority, "default": q.name == default,
             "description": q.description, "fairshare": q.fairshare.model_dump() if q.fairshare else None,
             "users": q.users, "groups": q.groups,  # who may submit (None and None: everyone)
             "pend": counts.get((q.name, "PEND"), 0) + counts.get((q.name, "PSUSP"), 0) + queued.get(q.name, 0),
             "run": counts.get((q.name, "RUN"), 0) + counts.get((q.name, "DISP"), 0) - queued.get(q.name, 0)}
            for q in self.state.config.queues]}

    def api_stop(self, caller: Caller, query: dict, body: Any) -> dict:
        if not caller.is_admin:
            raise errors.TransitionError("only the cluster's admins (or its owner, or root) may stop the controller")
        self.stop()
        return {"stopping": True}


def _probe_to_wire(probe) -> dict | None:
    """What the host's agent said of itself when it last connected (None: never yet)."""
    if probe is None:
        return None
    return {"hostname": probe.hostname, "cpus": probe.cpus, "mem": probe.mem, "version": probe.agent_version,
            **probe.extra}


def _ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise errors.SpecError(f"job ids must be whole numbers, not {text!r}") from None


def _flag(query: dict, name: str) -> bool:
    return query.get(name, "").lower() in ("1", "true", "yes")
