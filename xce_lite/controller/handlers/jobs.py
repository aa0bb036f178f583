"""The controller's API handlers: one method per route, each validating, acting, replying.

A mixin of `Controller` (it shares the controller's in-memory view and lock); kept apart so the tick
and recovery read on their own. Handlers run on the API server's threads: they take `self._mu` for
the in-memory view, and the store serialises the writes.
"""

from __future__ import annotations

import base64
import os
import time
from collections import defaultdict
from typing import Any

from xce_lite import errors
from xce_lite.api.server import Caller
from xce_lite.api.wire import job_to_wire
from xce_lite.config.merge import Effective
from xce_lite.config.merge_view import describe
from xce_lite.config.sched_view import admit, effective
from xce_lite.controller import accept
from xce_lite.lifecycle import next_state
from xce_lite.models import DISP, DONE, EXIT, PEND, PENDING_STATES, PSUSP, RUN, Job, JobSpec
from xce_lite.sched.placement import JobRequest, place, why_never
from xce_lite.sched.reasons import Refusal


class ApiHandlers:
    def routes(self) -> dict:
        """Every route behind the permission rules (shared.py: who may act on which job, what others
        see of a job) and the store's refusal."""
        return {route: _store_refusal(self._permitted(route, handler)) for route, handler in self._routes().items()}

    def _routes(self) -> dict:
        return {
            ("GET", "/status"): self.api_status,
            ("POST", "/jobs"): self.api_submit,
            ("GET", "/jobs"): self.api_jobs,
            ("POST", "/jobs/kill"): self.api_kill,
            ("POST", "/jobs/hold"): self.api_hold,
            ("POST", "/jobs/release"): self.api_release,
            ("POST", "/jobs/suspend"): self.api_suspend,
            ("POST", "/jobs/resume"): self.api_resume,
            ("GET", "/jobs/wait"): self.api_wait,
            ("GET", "/hosts"): self.api_hosts,
            ("POST", "/hosts/reconnect"): self.api_reconnect,
            ("GET", "/jobs/why"): self.api_why,
            ("GET", "/jobs/peek"): self.api_peek,
            ("GET", "/queues"): self.api_queues,
            ("POST", "/controller/stop"): self.api_stop,
            **self.config_routes(),
            **self.flow_routes(),
            **self.metrics_routes(),  # metrics:
            **self.project_routes(),
        }

    def api_status(self, caller: Caller, query: dict, body: Any) -> dict:
        with self._mu:
            waiting = len(self._gate) - len(self._gate.fed)  # pending, not yet the scheduler's to place
            counts = {"pending": len(self._pending) + waiting, "held": len(self._held), "active": len(self._active)}
            faults = self.fault_status()
        server = getattr(self, "_server", None)
        return {"cluster": self.cluster, "pid": os.getpid(), "home": str(self.home.root),
                "started_at": self.started_at, "jobs": counts, "you": caller.user, **faults,
                "api": server.stats() if server is not None else None}  # connections, workers, refusals

    def api_submit(self, caller: Caller, query: dict, body: Any) -> dict:
        """Validate every spec (all or nothing), resolve its dependency, store them (an array as its
        elements), wake the scheduler, return the ids (an array's is its first element's).

        With a `request_id` (the client's, for one submission), a repeat of that id after a lost
        reply is answered with the jobs the first one stored, and stores nothing."""
        if not isinstance(body, dict) or not isinstance(body.get("jobs"), list) or not body["jobs"]:
            raise errors.SpecError('send {"jobs": [spec, ...]} with at least one job spec')
        request_id = _request_id(body)
        if request_id is not None:
            stored = self.store.submitted(request_id, caller.user)
            if stored is not None:
                return self._submitted_reply(stored)
        accepted = accept.specs(self, body["jobs"], caller)  # checked and merged once per distinct spec
        now = self._clock.time()  # the seam: a simulation submits at its own time
        if request_id is None:
            ids = self.store.submit(accepted, caller.user, now)  # on disk before the reply
        else:
            ids, new = self.store.submit_once(accepted, caller.user, now, request_id)
            if not new:  # the same request, sent again meanwhile: it stored them
                return self._submitted_reply(ids)
        self.metrics.inc("submits", sum(len(item.indices) or 1 for item in accepted))  # metrics:
        with self._mu:
            accept.admit(self, ids, accepted, caller.user, now)  # into the pending set in one step
            self._dirty = True
        self._wake.set()
        return {"ids": ids, "queues": [item.queue for item in accepted],
                "sizes": [len(item.indices) or None for item in accepted]}

    def _submitted_reply(self, ids: list[int]) -> dict:
        """The reply a submission got, rebuilt from the store (for a repeated request id)."""
        queues = {job.id: job.queue for job in self.store.jobs(ids)}
        sizes = [self.store.array_size(i) for i in ids]  # an array's id is its first element's
        return {"ids": ids, "queues": [queues.get(i, "") for i in ids], "sizes": sizes, "repeated": True}

    def _validate(self, raw: Any, caller: Caller | None = None) -> tuple[JobSpec, str]:
        """The spec as it will be stored (its profile name and project resolved), and its queue's
        name; SpecError if its effective values break a rule or could never run (merge.py), or its
        project refuses it (projects.py)."""
        spec, queue_name, eff = admit(JobSpec.from_wire(raw), self.config, self.profiles, self.host_totals,
                                      self._why_never)
        spec = self._project_of(spec, eff, caller)
        self._pool_admit(queue_name, eff)  # pools.py: a -W no allocation of the queue's pools can hold
        if not os.path.isdir(spec.cwd):
            raise errors.SpecError(f"working directory {spec.cwd} does not exist or is not a directory")
        if not os.access(spec.cwd, os.R_OK | os.X_OK):
            raise errors.SpecError(f"working directory {spec.cwd} is not readable by the controller")
        for option, path in (("-o", spec.stdout), ("-e", spec.stderr)):
            if path is not None and not os.path.isdir(os.path.dirname(path) or "/"):
                raise errors.SpecError(f"{option} {path}: its directory does not exist; create it first")
        return self._as_submitter(spec, queue_name, caller), queue_name  # shared.py: queue ACL, run as whom

    def _why_never(self, request: JobRequest) -> str | None:
        """`why_never` on the cluster's totals, memoised by request shape while those totals are the
        same object (a new config or pool view replaces them): 1,000 hosts cost ~25 ms a submit."""
        totals = self.host_totals
        memo = getattr(self, "_never_memo", None)
        if memo is None or memo[0] is not totals:
            memo = self._never_memo = (totals, {})
        key = (request.min_tasks, request.max_tasks, request.resreq)
        if key not in memo[1]:
            memo[1][key] = why_never(request, totals, self.config.shared)
        return memo[1][key]

    def api_jobs(self, caller: Caller, query: dict, body: Any) -> dict:
        """Jobs, and arrays summed up (one entry each, with their elements' count by state); an
        array's elements too with `elements`. `ids`: jobs, arrays (42) and elements (42[7])."""
        refs = self._expand_refs([part for part in query.get("ids", "").split(",") if part.strip()])
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
        wired = self._to_wire(jobs, _flag(query, "effective"))
        if _flag(query, "history"):  # every attempt's events: dispatched, started, requeued (a retry), ...
            for job in wired:
                job["history"] = [{"time": t, "kind": kind, "data": data}
                                  for t, kind, data in self.store.events(job["id"])]
        return {"schema": 1, "jobs": wired, "arrays": summaries}

    def _to_wire(self, jobs: list[Job], with_effective: bool = False) -> list[dict]:
        """Jobs as the API shows them: pend reasons are the live ones (the store's may lag a second);
        task counts are the effective ones. `with_effective`: each job's effective values, as rows
        (field, value, origin): those fixed at dispatch, or the live ones while it waits."""
        wired = []
        for j in jobs:
            job = job_to_wire(j)
            eff = self._job_effective(j)
            if isinstance(eff, Effective):
                job.update(min_slots=eff.min_tasks, max_slots=eff.max_tasks)
                if not j.hosts:
                    job["slots"] = eff.min_tasks
            if with_effective:
                job["effective"] = describe(eff) if isinstance(eff, Effective) else []
                job["effective_problem"] = eff if isinstance(eff, str) else None
                job["fairshare"] = self.fair_standing(j) if j.state in PENDING_STATES else None
            wired.append(job)
        with self._mu:
            for job in wired:
                if job["state"] == PEND and job["id"] in self._reasons:
                    job["pend_reason"] = self._reasons[job["id"]]
        return wired

    def _job_effective(self, job: Job) -> Effective | str | None:
        """Fixed at dispatch, else live for a waiting job; the reason when it cannot be merged now."""
        if job.effective:
            return Effective.from_json(job.effective)
        if job.state not in PENDING_STATES:
            return None  # ended before it was dispatched, or dispatched before schema 4
        try:
            return effective(job.spec, job.queue, self.config, self.profiles)
        except errors.SpecError as err:
            return str(err)

    def _owned(self, caller: Caller, ids: list[int]) -> list[Job]:
        if not ids:
            raise errors.SpecError("name at least one job id")
        jobs = {j.id: j for j in self.store.jobs(ids)}
        missing = [i for i in ids if i not in jobs]
        if missing:
            raise errors.NotFound(f"no such job: {', '.join(map(str, missing))}")
        foreign = [i for i in ids if not caller.is_admin and not self._may_act(caller, jobs[i])]
        if foreign:  # the route table checked the action already (shared.py); this is the last guard
            raise errors.TransitionError(self._act_refusal(caller, jobs[foreign[0]], "act on"))
        return [jobs[i] for i in ids]

    def api_kill(self, caller: Caller, query: dict, body: Any) -> dict:
        results = []
        now = time.time()
        for label, jobs, whole in self._owned_refs(caller, body):
            if not whole:
                results.append({"id": label, **self._kill_one(jobs[0], caller, now)})
                continue
            pending = self._kill_pending([j for j in jobs if j.state in (PEND, PSUSP)], caller, now)
            active = [self._kill_one(j, caller, now) for j in jobs
                      if j.id not in pending and j.state not in (DONE, EXIT)]
            killed = len(pending) + sum(1 for r in active if r["ok"])
            results.append({"id": label, "ok": killed > 0 or len(active) == 0,
                            "message": f"Array <{label}>: {killed} element(s) being terminated"
                                       + (f", {len(jobs) - killed} had finished or were out of reach"
                                          if killed < len(jobs) else "")})
        return {"results": results}

    def _kill_one(self, job: Job, caller: Caller, now: float) -> dict:
        reason = f"killed by {caller.user}"
        name = job.display_id
        if job.state in (PEND, PSUSP):
            if self._kill_pending([job], caller, now):
                return {"ok": True, "message": f"Job <{name}> is being terminated"}
            job = self.store.get(job.id) or job  # it was dispatched meanwhile: kill it there
        if job.state in (DISP, RUN) and job.unit:
            # Recorded first (kill wins across restarts and lost hosts), then delivered by the tick on
            # the host's worker (kills.py): a host that does not answer holds up neither this reply
            # nor the tick; one out of reach gets the kill when it answers, or the job ends EXIT
            # with this reason when the host is declared lost.
            self.store.record_event(job.id, "kill_requested", now, {"by": caller.user, "reason": reason})
            first = job.hosts[0][0]
            with self._mu:
                self.kills.mark(job.id, reason)
                reachable = first in self._hosts and first not in self.trouble
            self._wake.set()
            if reachable:
                return {"ok": True, "message": f"Job <{name}> is being terminated"}
            return {"ok": True, "message": f"Job <{name}> is being terminated: its host {first} does not answer "
                                           f"now; the kill is recorded and reaches it when it answers (if the "
                                           f"host is declared lost first, the job ends EXIT all the same)"}
        return {"ok": False, "message": f"Job <{name}> has already finished ({job.state})"}

    def api_hold(self, caller: Caller, query: dict, body: Any) -> dict:
        return self._hold_or_release(caller, body, "held", f"held by {caller.user}")

    def api_release(self, caller: Caller, query: dict, body: Any) -> dict:
        return self._hold_or_release(caller, body, "released", None)

    def _hold_or_release(self, caller: Caller, body: Any, event: str, reason: str | None) -> dict:
        """PEND <-> PSUSP, as the lifecycle allows; the store's guarded update refuses a stale view.
        A whole array moves in one transaction per state, with one result line."""
        results = []
        for label, jobs, whole in self._owned_refs(caller, body):
            refused: list[dict] = []
            movable = [(job, target) for job in jobs if (target := _next_or_refuse(job, event, refused)) is not None]
            if event == "released":  # a job outside its project stays held (projects.py)
                movable = self._releasable(movable, refused)
            moved = self._move_pending(movable, event, reason)
            if whole:
                results.append({"id": label, "ok": bool(moved) or not movable,
                                "message": f"Array <{label}>: {len(moved)} element(s) {event}"
                                           + (f", {len(jobs) - len(moved)} were not pending" if len(moved) < len(jobs)
                                              else "")})
                continue
            results.extend({**r, "id": label} for r in refused)
            if movable:
                results.append({"id": label, "ok": bool(moved),
                                "message": f"Job <{label}> is {event}" if moved
                                else f"Job <{label}> changed meanwhile; look again with `xce jobs {label}`"})
        self._wake.set()
        return {"results": results}

    def api_suspend(self, caller: Caller, query: dict, body: Any) -> dict:
        return self._suspend_or_resume(caller, body, "suspended", "STOP")

    def api_resume(self, caller: Caller, query: dict, body: Any) -> dict:
        return self._suspend_or_resume(caller, body, "resumed", "CONT")

    def _suspend_or_resume(self, caller: Caller, body: Any, event: str, signal: str) -> dict:
        """RUN <-> USUSP (LSF's bstop and bresume): every unit of the job gets STOP or CONT, which
        its supervisor passes to the job's processes (and its `xce launch` tasks). The run limit
        keeps counting while a job is suspended."""
        results = []
        for job in (j for _label, jobs, _whole in self._owned_refs(caller, body) for j in jobs):
            target = _next_or_refuse(job, event, results)
            if target is None:
                continue
            with self._mu:
                active = self._active.get(job.id)
                units = [(active.host_of(i), u) for i, u in enumerate(active.units)] if active else []
            hosts = [(self._hosts.get(name), unit) for name, unit in units]
            if not units or hosts[0][0] is None:
                results.append({"id": job.id, "ok": False,
                                "message": f"Job <{job.id}>: its first host is out of reach; try again later"})
                continue
            delivered = [host.signal(unit, signal, f"{event} by {caller.user}")
                         for host, unit in hosts if host is not None]
            if not delivered[0]:
                results.append({"id": job.id, "ok": False, "message": f"Job <{job.id}> is not running any more"})
                continue
            with self._mu:
                moved = self.store.change_state([job.id], job.state, target, event, time.time(),
                                                reason=f"{event} by {caller.user}" if event == "suspended" else None)
                if moved and job.id in self._active:
                    self._active[job.id].state = target
            results.append({"id": job.id, "ok": bool(moved), "message": f"Job <{job.id}> is {event}" if moved
                            else f"Job <{job.id}> changed meanwhile; look again with `xce jobs {job.id}`"})
        return {"results": results}

    def api_wait(self, caller: Caller, query: dict, body: Any) -> dict:
        """Block until every job named has finished, or `timeout` seconds; long-poll for `xce wait`."""
        refs = self._expand_refs([part for part in query.get("ids", "").split(",") if part.strip()])
        ids = [i for _label, job_ids, _whole in refs for i in job_ids]
        if not ids:
            raise errors.SpecError("name at least one job id to wait for")
        try:
            timeout = min(float(query.get("timeout", 30)), 300.0)
        except ValueError:
            raise errors.SpecError(f"timeout must be a number of seconds, not {query.get('timeout')!r}") from None
        if timeout != timeout:  # NaN
            raise errors.SpecError("timeout must be a number of seconds, not NaN")
        deadline = time.monotonic() + timeout
        with self._mu:
            while any(i in self._pending or i in self._gate or i in self._held or i in self._active for i in ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._finished.wait(left)
        jobs = self.store.jobs(ids)
        finished = all(j.state in (DONE, EXIT) for j in jobs)
        return {"schema": 1, "finished": finished, "jobs": self._to_wire(jobs)}

    def api_hosts(self, caller: Caller, query: dict, body: Any) -> dict:
        """Each host: state (ok, or unreach with since when), how it runs jobs, and per resource its
        total, what jobs reserve, what is free."""
        with self._mu:
            views = self._hosts_now()
            running: dict[str, int] = defaultdict(int)
            for job in self._active.values():
                for host, _tasks in job.hosts:
                    running[host] += 1
            probes, since, why = dict(self._probes), dict(self._down_since), dict(self._down_why)
            lost, trouble, states = set(self._lost_hosts), self.trouble.copy(), dict(self._host_state)
            refused = self._refused_hosts()  # shared.py: cannot run jobs as their users
        pools = self._pools_wire(time.time())
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
        unknown = [n for n in names if n not in self._links]
        if unknown:
            raise errors.NotFound(f"no such host: {', '.join(unknown)} (see `xce hosts`)")
        for name in names:
            self._links[name].retry_now()
        return {"reconnecting": names}

    def api_why(self, caller: Caller, query: dict, body: Any) -> dict:
        """Why a pending job waits: the placement tried now, per host and per resource."""
        refs = self._expand_refs([query["id"]]) if query.get("id") else []
        if not refs or len(refs[0][1]) != 1:
            raise errors.SpecError("name a job or an array element: /jobs/why?id=JOBID (or 42[7])")
        job = self._owned(caller, refs[0][1])[0]
        if job.state != PEND:
            return {"id": job.id, "state": job.state, "lines": [f"Job <{job.display_id}> is {job.state}, not pending"
                                                                + (f": {job.reason}" if job.reason else "")]}
        with self._mu:
            gated = job.id in self._gate and job.id not in self._gate.fed
            reason = self._reasons.get(job.id)
        if gated:  # it is not the scheduler's to place yet
            return {"id": job.id, "state": job.state, "summary": reason or "waiting for its dependency", "lines": []}
        with self._mu:
            hosts, shared = self._hosts_now(), self._shared_free()
        eff = self._job_effective(job)
        rows = describe(eff) if isinstance(eff, Effective) else []
        if not isinstance(eff, Effective):
            return {"id": job.id, "state": job.state, "effective": rows,
                    "summary": f"cannot run as configured now: {eff}", "lines": []}
        fair = self.fair_standing(job)
        extra = {"fairshare": fair} if fair is not None else {}
        limited = self.project_room(job, eff)
        if limited is not None:
            return {"id": job.id, "state": job.state, "effective": rows, "summary": limited, "lines": [], **extra}
        request = JobRequest(job.id, eff.min_tasks, eff.max_tasks, eff.resreq)
        hosts, request = self._pool_why(job.queue, hosts, request, eff.run_limit)  # pools.py
        result = place(request, hosts, shared)
        if not isinstance(result, Refusal):
            where = " ".join(f"{n}*{h}" for h, n in result.hosts)
            return {"id": job.id, "state": job.state, "effective": rows,
                    "lines": [f"it fits now ({where}); the scheduler will start it at its next session"], **extra}
        return {"id": job.id, "state": job.state, "effective": rows, "summary": self._pool_words(result.summary()),
                "lines": [self._pool_words(line) for line in result.details()], **extra}

    def api_peek(self, caller: Caller, query: dict, body: Any) -> dict:
        """A piece of a job's output file, read on its first host through the agent (shared file
        systems are common, not assumed): `offset` where to start, `stream` out or err."""
        ids = _ids(query.get("id", ""))
        if len(ids) != 1:
            raise errors.SpecError("name one job: /jobs/peek?id=JOBID")
        job = self._owned(caller, ids)[0]
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
        host = self._hosts.get(name)
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
        default = self.config.default_queue.name
        return {"schema": 1, "queues": [
            {"name": q.name, "priority": q.priority, "default": q.name == default,
             "description": q.description, "fairshare": q.fairshare.model_dump() if q.fairshare else None,
             "users": q.users, "groups": q.groups,  # who may submit (None and None: everyone)
             "pend": counts.get((q.name, "PEND"), 0) + counts.get((q.name, "PSUSP"), 0),
             "run": counts.get((q.name, "RUN"), 0) + counts.get((q.name, "DISP"), 0)}
            for q in self.config.queues]}

    def api_stop(self, caller: Caller, query: dict, body: Any) -> dict:
        if not caller.is_admin:
            raise errors.TransitionError("only the cluster's admins (or its owner, or root) may stop the controller")
        self.stop()
        return {"stopping": True}


def _store_refusal(handler):
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


def _next_or_refuse(job: Job, event: str, results: list[dict]) -> str | None:
    """The job's state after `event`, or None with the lifecycle's refusal added to `results`."""
    try:
        return next_state(job.state, event)
    except errors.TransitionError as err:
        results.append({"id": job.id, "ok": False, "message": f"Job <{job.id}>: {err}"})
        return None


def _probe_to_wire(probe) -> dict | None:
    """What the host's agent said of itself when it last connected (None: never yet)."""
    if probe is None:
        return None
    return {"hostname": probe.hostname, "cpus": probe.cpus, "mem": probe.mem, "version": probe.agent_version,
            **probe.extra}


def _request_id(body: dict) -> str | None:
    """The submission's request id: None, or 8 to 128 letters, digits and . _ : -."""
    value = body.get("request_id")
    if value is None:
        return None
    if not isinstance(value, str) or not 8 <= len(value) <= 128 or not all(
            c.isascii() and (c.isalnum() or c in "._:-") for c in value):
        raise errors.SpecError("request_id must be 8 to 128 letters, digits and . _ : - (a random one per submission)")
    return value


def _ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise errors.SpecError(f"job ids must be whole numbers, not {text!r}") from None


def _refs_of(body: Any) -> list:
    """The jobs a request names: ids, or text such as "42" and "42[7]"."""
    ids = body.get("ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, (int, str)) and not isinstance(i, bool)
                                                       for i in ids):
        raise errors.SpecError('send {"ids": [job id or "42[7]", ...]} naming at least one job')
    return ids


def _flag(query: dict, name: str) -> bool:
    return query.get(name, "").lower() in ("1", "true", "yes")
