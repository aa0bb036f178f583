"""Host pools of Slurm allocations, in the controller: a part (`Controller.pools`) whose `step` the tick runs.

Every POLL seconds it hands each pool's worker an squeue (slurmwork.py: Slurm's commands never
run on the tick, so a frozen or dead slurmctld, or `via:` login host, stalls nothing); when the
answer comes, it brings each record up to date and carries out the pure policy (sched/pools.py): sbatch what the backlog
needs, scancel what is idle or draining, both handed to the worker too. While squeue fails, the
pool shows Slurm's trouble (`xce hosts -l`, pend reasons) and decides nothing.
An allocation's node becomes a temporary host, POOL-JOBID (POOL-JOBID-N with
several nodes), reached through a relay (exec/slurmhost.py) by a link like any host's; it offers
the pool's slots and mem, with the attribute `time_left` (seconds to the allocation's limit), so
that a job whose -W outlasts the allocation is never placed there (a select term every job with
a run limit gets, `time_left_term`). A queue's `hosts:` naming the pool means all its hosts.
What the scheduler, submit, pend reasons and `xce hosts -l` see of pools is pool_views.py.

Invariants:
- Intent before action: a record (the pool's next sequence number) is stored before its sbatch,
  under a job name of its own (xce-CLUSTER-POOL-SEQ); a controller that died between the two, or
  an sbatch that timed out (slurmctld may take up the request later), finds the allocation by that
  name, so nothing is submitted twice or lost: the record counts as submitting until Slurm says.
- Everything about allocations is in the store (meta key `slurm_pools`): a restarted controller
  adopts running allocations (their hosts reconnect, their jobs are adopted from the agents'
  journals), it never resubmits them.
- An allocation that ends (time limit, scancel, node failure) takes its hosts with it: their jobs
  are requeued (or end EXIT, `on_host_lost: exit`) at once, as for a lost host: Slurm has killed
  them, there is nothing to wait for.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any

from xce_lite.config.cluster import PoolConfig
from xce_lite.controller.kills import on_lost
from xce_lite.controller.pool_ends import PoolEnds, late_results
from xce_lite.controller.pool_views import DRAIN_MARGIN, LIVE, AllocRecord, PoolRecords, PoolViews
from xce_lite.controller.seams import Clock
from xce_lite.controller.state import Active, ControllerState
from xce_lite.controller.slurmwork import Polled, SlurmWork, Submitted, pool_config, pool_dir, slurm_via, via_target
from xce_lite.exec import bundle, slurm
from xce_lite.exec.host import JobResult
from xce_lite.exec.link import HostLink
from xce_lite.exec.slurmhost import SlurmHost
from xce_lite.models import EXIT
from xce_lite.sched import pools as policy
from xce_lite.home.paths import Home
from xce_lite.sched.placement import SLOTS, HostView
from xce_lite.store.jobs import Requeue

POLL = 2.0  # seconds between two looks at Slurm
SBATCH_BACKOFF = 30.0  # seconds without sbatch after one failed
SUBMIT_LOST_AFTER = 120.0  # an intent Slurm never heard of, after this long, was never submitted
META_KEY = "slurm_pools"
REQUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING")  # after RUNNING: taken back
KEEP_ENDED = 10  # ended allocations kept per pool, for `xce hosts -l`


def load_records(store: Any) -> PoolRecords:
    """The pools' records as the store keeps them (a restarted controller adopts its allocations)."""
    saved = json.loads(store.meta(META_KEY) or "{}")
    return PoolRecords(saved.get("seq", 0), [AllocRecord(**r) for r in saved.get("allocations", [])])


class Pools:
    """See the module docstring. Given the shared state, the records (shared with `views`), the
    store, the home, the clock, the log, the controller's event queue (the pool hosts' links put
    theirs there), what is free on the hosts now (`hosts_now`), and how the units' part takes a
    unit's end (`unit_finished(host, unit, result, now)`) and ends a job (`end_job(job, state,
    reason, event, now)`), both holding the lock."""

    def __init__(self, state: ControllerState, records: PoolRecords, views: PoolViews, store: Any, home: Home,
                 clock: Clock, log: Callable[[str], None], events: Any,
                 hosts_now: Callable[[], tuple[HostView, ...]],
                 unit_finished: Callable[[str, str, JobResult, float], None],
                 end_job: Callable[[Active, str, str, str, float], None]) -> None:
        self.state, self.records, self.views, self.store, self.home = state, records, views, store, home
        self.clock, self.log, self.events, self.hosts_now = clock, log, events, hosts_now
        self.unit_finished, self.end_job = unit_finished, end_job
        self.slurm = SlurmWork(state.wake.set)  # the Slurm commands, never on the tick (slurmwork.py)
        self.ends = PoolEnds(self._running_pool, unit_finished, self._poll_soon, log)  # ends Slurm may explain

    # ---- the step -------------------------------------------------------------------------------

    def step(self, now: float) -> None:
        """Take the Slurm commands' outcomes, act on the policy for each pool whose squeue just
        answered, and hand over a new squeue every POLL seconds (one at a time per pool). Never
        waits for Slurm: the commands run on the pools' workers (slurmwork.py)."""
        names = {p.name for p in self.state.config.pools} | {r.pool for r in self.records.allocs if r.state in LIVE}
        if not names and not self.slurm.busy():
            return
        changed, fresh = False, {}
        for res in self.slurm.results():
            if isinstance(res, Polled):
                changed |= self._pool_polled_now(res, now)
                if res.jobs is not None:
                    fresh[res.pool] = res.began
            elif isinstance(res, Submitted):
                changed |= self._pool_submitted(res, now)
            elif res.error is not None:
                self.records.cancel_at.pop(res.job_id, None)  # handed over again by the next decision
                self.log(f"pool {res.pool}: {res.error}")
        for pool in self.state.config.pools:
            if pool.name in fresh:
                changed |= self._pool_act(pool, now)
        with self.state.mu:
            for name, began in fresh.items():
                self.ends.answered(name, began, now)
            self.ends.expire(now)
        for name in sorted(names):
            if now - self.records.polled.get(name, 0.0) >= POLL and not self.slurm.outstanding(name, "poll"):
                self.records.polled[name] = now
                self.slurm.poll(name, partial(slurm.squeue, via=self._via(name)))
        with self.state.mu:
            self.views.refresh(now)  # time_left, as of this tick
        if changed:
            self._save_pools()
            with self.state.mu:
                self.state.dirty = True  # a session again: the pend reasons say what the pools do now

    def _running_pool(self, host: str) -> str | None:
        r = self.records.host_of.get(host, (None, ""))[0]
        return r.pool if r is not None and r.state == "running" else None

    def _poll_soon(self, pool: str) -> None:
        self.records.polled[pool] = 0.0  # the next step asks (after one on its way, if any)
        self.state.wake.set()

    def _pool_polled_now(self, res: Polled, now: float) -> bool:
        """An squeue's answer for pool `res.pool`: Slurm's trouble, or each allocation brought up to date."""
        if res.jobs is None:
            before = self.records.trouble.get(res.pool)
            if before is None or before[0] != res.error:
                self.log(f"pool {res.pool}: {res.error}")
            self.records.trouble[res.pool] = (res.error or "", before[1] if before else now)
            return before is None
        changed = self.records.trouble.pop(res.pool, None) is not None
        if changed:
            self.log(f"pool {res.pool}: Slurm answers again")
        seen = res.jobs
        by_name = {j.name: j for j in seen.values()}
        for r in [r for r in self.records.allocs if r.pool == res.pool and r.state in LIVE]:
            changed |= self._pool_update(r, seen, by_name, now, res.began)
        for r in self.records.allocs:
            if r.pool != res.pool or r.settled:
                continue
            job = seen.get(r.job_id or "")
            if job is None or job.ended:  # the final word, where Slurm still has it
                r.settled, changed = True, True
                if job is not None:
                    r.reason = r.reason.replace("COMPLETING", job.state)
        return changed

    def _pool_submitted(self, res: Submitted, now: float) -> bool:
        """An sbatch's answer: the allocation's job id; or it failed (a back-off before the next);
        or it is unknown whether Slurm got it (the squeues ask for it by name: see _pool_update)."""
        self.records.sending.discard((res.pool, res.seq))
        r = next((r for r in self.records.allocs if r.pool == res.pool and r.seq == res.seq), None)
        if r is None:
            return False
        if res.job_id is not None:
            if r.job_id is None:
                r.job_id = res.job_id
            if r.state == "submitting":
                r.state, r.reason = "pending", ""
            self.log(f"pool {r.pool}: submitted allocation {r.job_id}")
        elif r.job_id is not None:
            pass  # an squeue found it by its name already
        elif res.unsure:
            r.reason, r.unsure_since = f"{res.error}; waiting for Slurm to say whether it has it", res.ended
            self.records.trouble.setdefault(r.pool, (res.error or "", now))  # until an squeue answers
            self.log(f"pool {r.pool}: {res.error}; the allocation is looked for by its name "
                     f"{self._slurm_name(r.pool, r.seq)} (never submitted twice)")
        else:
            r.state, r.reason = "failed", res.error or "sbatch failed"
            self.records.retry_at[r.pool] = now + SBATCH_BACKOFF
            self.log(f"pool {r.pool}: {r.reason}; trying again in {SBATCH_BACKOFF:g} s")
        return True

    def _via(self, pool: str) -> slurm.Runner | None:
        return slurm_via(self.state.config, self.home, pool)

    def _slurm_name(self, pool: str, seq: int) -> str:
        return f"xce-{self.state.cluster}-{pool}-{seq}"

    def _pool_update(self, r: AllocRecord, seen: dict, by_name: dict, now: float, asked: float) -> bool:
        """One live allocation against what an squeue asked at `asked` says; True if its record changed."""
        before = asdict(r)
        if r.job_id is None:
            if (r.pool, r.seq) in self.records.sending:
                return False  # its sbatch has not answered yet
            job = by_name.get(self._slurm_name(r.pool, r.seq))
            if job is None:
                # Slurm never heard of it: judged only by an squeue asked well after the sbatch
                # ended (slurmctld may take up a request whose client had given up)
                if asked - (r.unsure_since or r.submit_time) > SUBMIT_LOST_AFTER:
                    r.state, r.reason = "failed", "never reached Slurm (the sbatch did not answer, or the " \
                                                  "controller stopped during it)"
                return asdict(r) != before
            r.job_id = job.job_id
            self.log(f"pool {r.pool}: allocation {r.job_id} adopted (found by its name in Slurm)")
        job = seen.get(r.job_id)
        if job is None or job.ended or job.state == "COMPLETING":
            state = job.state if job is not None else "gone from squeue"
            said = f" ({job.reason})" if job is not None and job.reason not in ("", "None") else ""
            why = f"Slurm job {r.job_id} {state}{said}"
            self._pool_end(r, why, now, job.end_time if job is not None else None)
            r.settled = job is None or job.state != "COMPLETING"
        elif job.state == "RUNNING":
            if r.state != "running" or not self._pool_linked(r):
                r.state, r.nodes, r.nodelist = "running", list(job.nodes), job.nodelist
                r.start_time, r.reason = job.start_time or now, ""
                r.idle_since = r.idle_since or now
                self._pool_connect(r)
            r.end_time = job.end_time if job.time_limit is not None else None
        elif r.state == "running" and job.state in REQUEUED:
            # Slurm took it back (a requeue; or a slurmctld killed before it saved the allocation's
            # start, observed: it runs the batch script again): the nodes' keepers, and the jobs
            # under them, are gone or about to be. Its hosts are lost; it is released, not reused.
            r.release = r.release or f"Slurm requeued it ({job.state})"
            self._pool_end(r, f"Slurm job {r.job_id} {job.state} again after it ran", now)
            self.records.cancel_at[r.job_id] = now
            self.slurm.cancel(r.pool, r.job_id, partial(slurm.scancel, r.job_id, self._via(r.pool)))
        elif job.state != "SUSPENDED":
            r.state, r.reason = "pending", job.reason if job.reason != "None" else job.state.lower()
        return asdict(r) != before

    def _pool_linked(self, r: AllocRecord) -> bool:
        return all(name in self.state.links for name in r.host_names())

    def _pool_connect(self, r: AllocRecord) -> None:
        """Start the links of a running allocation's hosts (after its start, or a restart)."""
        pool = pool_config(self.state.config, r.pool)
        if pool is None:
            return  # the pool left the configuration: its allocations are only watched until they end
        assert r.job_id is not None  # a running allocation has its Slurm job id
        directory, job_id, python, direct = pool_dir(self.home, pool), r.job_id, pool.python, pool.connect == "direct"
        agent, via = bundle.install(directory), via_target(self.state.config, self.home, pool.name)
        for name, node in zip(r.host_names(), r.nodes):
            if name in self.state.links:
                continue
            self.records.host_of[name] = (r, node)

            def factory(name: str = name, node: str = node) -> SlurmHost:
                return SlurmHost(name, job_id, node, directory, agent, python=python, nodelist=r.nodelist,
                                 direct=direct, via=via)

            link = HostLink(name, factory, self.events, self.log, backoff_max=self.state.config.ssh.reconnect_max)
            with self.state.mu:
                self.state.links[name] = link
                self.state.host_state.setdefault(name, "unreachable")
                self.state.down_since.setdefault(name, self.clock.time())
                self.state.dirty = True
            link.start()
        self.log(f"pool {r.pool}: allocation {r.job_id} runs on {r.nodelist}; connecting to "
                 + ", ".join(r.host_names()))

    def _pool_end(self, r: AllocRecord, why: str, now: float, ended_at: float | None = None) -> None:
        """The allocation has ended (at `ended_at`, as Slurm says; None: unknown): its hosts are
        gone, with every job on them (requeued), except a job whose end the journal on the shared
        file system holds from before the allocation's end (its report died with the relay: it
        counts). When Slurm no longer says when it ended, no such end counts: a requeue is safe."""
        r.state, r.reason, r.end_time = "ended", f"{why}; released: {r.release}" if r.release else why, now
        # every host of it, linked or not: a controller restarted as Slurm ended it has not linked them yet
        names = r.host_names() if r.job_id else []
        pool = pool_config(self.state.config, r.pool)
        late = {} if ended_at is None or pool is None or not r.job_id else \
            late_results(pool_dir(self.home, pool), r.job_id, dict(zip(r.host_names(), r.nodes)), names, ended_at)
        with self.state.mu:
            for (host, unit), result in late.items():
                if unit in self.state.by_unit:
                    self.log(f"pool {r.pool}: the end of unit {unit} on {host} (before its allocation's) is "
                             "read from its journal")
                    self.unit_finished(host, unit, result, now)
            victims = [j for j in self.state.active.values()
                       if not j.ending and any(a.host in names for a in j.holding.allocs)]
            for job in victims:
                outcome = on_lost(job, f"host {job.holding.allocs[0].host} lost: {why}",
                                  self.state.config.controller.on_host_lost)  # kill wins (kills.py)
                if isinstance(outcome, Requeue):
                    job.ending = True
                    self.state.unrecorded_requeues.append(outcome)
                else:
                    self.end_job(job, EXIT, outcome, "lost", now)
            for name in names:
                self.state.lost_hosts.add(name)
                self.state.host_state.pop(name, None)
                self.state.down_since.pop(name, None)
                self.state.down_why.pop(name, None)
                self.state.hosts.pop(name, None)
                self.records.host_of.pop(name, None)
                for unit in [u for u, d in self.state.draining.items() if d.host == name]:
                    del self.state.draining[unit]  # Slurm ended it: nothing holds its share any more
            links = [self.state.links.pop(n) for n in names if n in self.state.links]
            self.state.dirty = True
        for link in links:  # off the tick: a relay may take its time to go
            threading.Thread(target=link.close, name=f"close-{link.name}", daemon=True).start()
        self.log(f"pool {r.pool}: allocation {r.job_id} ended: {why}"
                 + (f"; {len(victims)} job(s) {self.state.config.controller.on_host_lost}" if victims else ""))
        if victims:
            self.state.wake.set()

    def _pool_act(self, pool: PoolConfig, now: float) -> bool:
        """The policy's decision for `pool`, carried out; True if a record changed."""
        mine = [r for r in self.records.allocs if r.pool == pool.name and r.state in LIVE]
        with self.state.mu:
            views = {v.name: v for v in self.hosts_now()}
            busy_hosts = {a.host for j in self.state.active.values() for a in j.holding.allocs}
            busy_hosts |= {d.host for d in self.state.draining.values()}
            demand = self._pool_demand(pool)
        allocations = []
        for r in mine:
            if r.state == "running":
                names = r.host_names()
                busy = any(n in busy_hosts for n in names)
                r.idle_since = None if busy else (r.idle_since or now)
                free = sum(views[n].free[SLOTS] for n in names if n in views and views[n].state == "ok")
                end = r.end_time - DRAIN_MARGIN if r.end_time is not None else None  # as the scheduler sees it
                allocations.append(policy.Allocation(r.job_id or "", "running", end, busy, r.idle_since,
                                                     int(free)))
            else:
                allocations.append(policy.Allocation(r.job_id or f"seq{r.seq}", "pending"))
        shape = policy.PoolShape(pool.max_allocations, pool.slots * pool.nodes_per_allocation, pool.time_limit,
                                 pool.idle_timeout)
        decision = policy.decide(shape, allocations, demand, now, self.records.retry_at.get(pool.name))
        changed = False
        for job_id, why in decision.release:
            r = next(r for r in mine if r.job_id == job_id)
            if r.release is None:
                r.release, changed = why, True
                self.log(f"pool {pool.name}: releasing allocation {job_id}: {why}")
            sent = self.records.cancel_at.get(job_id)
            if sent is None or now - sent > SBATCH_BACKOFF:  # not sent, failed, or Slurm did not act on it
                self.records.cancel_at[job_id] = now
                self.slurm.cancel(pool.name, job_id, partial(slurm.scancel, job_id, self._via(pool.name)))
        for _ in range(decision.submit):
            self._pool_submit(pool, now)
            changed = True
        return changed

    def _pool_demand(self, pool: PoolConfig) -> list[policy.Demand]:
        """Jobs a scheduling session left pending that the pool's hosts may run (their queue allows
        the pool). Holds _mu. Counted up to what max_allocations could take."""
        allowed = {q.name for q in self.state.config.queues if q.hosts is None or pool.name in q.hosts}
        cap = pool.max_allocations * pool.slots * pool.nodes_per_allocation
        demand, slots = [], 0
        for job_id, reason in self.state.reasons.items():
            job = self.state.pending.get(job_id) if reason else None
            if job is None or job.queue not in allowed or job.blocked is not None:
                continue
            d = policy.Demand(job_id, job.request.min_tasks, policy.run_limit_of(job.request.resreq))
            demand.append(d)
            slots += d.slots
            if slots >= cap:
                break
        return demand

    def _pool_submit(self, pool: PoolConfig, now: float) -> None:
        """Store the intent, then hand the sbatch over (see the module docstring); its answer
        comes as a Submitted (_pool_submitted)."""
        self.records.seq += 1
        r = AllocRecord(pool.name, self.records.seq, submit_time=now)
        self.records.allocs.append(r)
        self._save_pools()
        directory = pool_dir(self.home, pool)
        try:
            agent = bundle.install(directory)
        except OSError as err:
            r.state, r.reason = "failed", f"cannot write the agent into {directory}: {err}"
            self.records.retry_at[pool.name] = now + SBATCH_BACKOFF
            self.log(f"pool {pool.name}: {r.reason}; trying again in {SBATCH_BACKOFF:g} s")
            return
        script = slurm.batch_script(pool.name, str(directory), pool.python, str(agent), pool.nodes_per_allocation,
                                    tcp=pool.connect == "direct")
        args = [*pool.sbatch_options(self._slurm_name(pool.name, r.seq)), f"--output={directory}/slurm-%j.out",
                f"--chdir={directory}"]
        self.records.sending.add((pool.name, r.seq))
        self.slurm.submit(pool.name, r.seq, partial(slurm.sbatch, script, args, self._via(pool.name)))

    def _save_pools(self) -> None:
        ended: dict[str, int] = {}
        keep = []
        for r in reversed(self.records.allocs):  # newest first: keep the last KEEP_ENDED ended per pool
            if r.state not in LIVE:
                ended[r.pool] = ended.get(r.pool, 0) + 1
                if ended[r.pool] > KEEP_ENDED:
                    continue
            keep.append(r)
        self.records.allocs = keep[::-1]
        saved = {"seq": self.records.seq, "allocations": [asdict(r) for r in self.records.allocs]}
        self.store.set_meta(META_KEY, json.dumps(saved))
