"""Host pools of Slurm allocations, in the controller: a mixin whose `_pools_step` the tick runs.

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
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from xce_lite.config.cluster import PoolConfig
from xce_lite.controller.pool_views import DRAIN_MARGIN, LIVE, PoolViews
from xce_lite.controller.slurmwork import Polled, SlurmWork, Submitted
from xce_lite.exec import bundle, slurm
from xce_lite.exec.link import HostLink
from xce_lite.exec.slurmhost import SlurmHost, results_on_disk
from xce_lite.models import EXIT
from xce_lite.sched import pools as policy
from xce_lite.sched.placement import SLOTS
from xce_lite.store.jobs import Requeue

POLL = 2.0  # seconds between two looks at Slurm
SBATCH_BACKOFF = 30.0  # seconds without sbatch after one failed
SUBMIT_LOST_AFTER = 120.0  # an intent Slurm never heard of, after this long, was never submitted
META_KEY = "slurm_pools"
REQUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING")  # after RUNNING: taken back
KEEP_ENDED = 10  # ended allocations kept per pool, for `xce hosts -l`


@dataclass
class AllocRecord:
    """One allocation of a pool: `submitting` (stored, sbatch not yet answered), `pending`, `running`,
    `ended` or `failed` (sbatch refused it). `reason` is Slurm's reason while pending, else why it
    ended or failed; `release` why xce cancelled it."""

    pool: str
    seq: int
    job_id: str | None = None
    state: str = "submitting"
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    nodelist: str = ""
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    idle_since: float | None = None
    release: str | None = None
    settled: bool = True  # False while Slurm still says COMPLETING: its final state is to come
    unsure_since: float | None = None  # its sbatch timed out then: Slurm may have it all the same

    def host_names(self) -> list[str]:
        if len(self.nodes) == 1:
            return [f"{self.pool}-{self.job_id}"]
        return [f"{self.pool}-{self.job_id}-{i}" for i in range(len(self.nodes))]


class PoolWork(PoolViews):
    """See the module docstring. Expects the controller's attributes (store, config, _mu, ...)."""

    def _init_pools(self) -> None:
        saved = json.loads(self.store.meta(META_KEY) or "{}")
        self._pool_seq: int = saved.get("seq", 0)
        self._allocs: list[AllocRecord] = [AllocRecord(**r) for r in saved.get("allocations", [])]
        self._pool_polled: dict[str, float] = {}  # pool -> when its last squeue was handed over
        self._pool_retry_at: dict[str, float] = {}
        self._pool_host_of: dict[str, tuple[AllocRecord, str]] = {}  # host -> (allocation, node)
        self._pool_trouble: dict[str, tuple[str, float]] = {}  # pool -> (Slurm's failure, since when)
        self._pool_sending: set[tuple[str, int]] = set()  # (pool, seq): its sbatch is handed over
        self._pool_cancel_at: dict[str, float] = {}  # allocation -> when its scancel was handed over
        self._slurm = SlurmWork(self._wake.set)  # the Slurm commands, never on the tick (slurmwork.py)
        self._refresh_pool_views(time.time())

    # ---- the step -------------------------------------------------------------------------------

    def _pools_step(self, now: float) -> None:
        """Take the Slurm commands' outcomes, act on the policy for each pool whose squeue just
        answered, and hand over a new squeue every POLL seconds (one at a time per pool). Never
        waits for Slurm: the commands run on the pools' workers (slurmwork.py)."""
        names = {p.name for p in self.config.pools} | {r.pool for r in self._allocs if r.state in LIVE}
        if not names and not self._slurm.busy():
            return
        changed, fresh = False, set()
        for res in self._slurm.results():
            if isinstance(res, Polled):
                changed |= self._pool_polled_now(res, now)
                if res.jobs is not None:
                    fresh.add(res.pool)
            elif isinstance(res, Submitted):
                changed |= self._pool_submitted(res, now)
            elif res.error is not None:
                self._pool_cancel_at.pop(res.job_id, None)  # handed over again by the next decision
                self.log(f"pool {res.pool}: {res.error}")
        for pool in self.config.pools:
            if pool.name in fresh:
                changed |= self._pool_act(pool, now)
        for name in sorted(names):
            if now - self._pool_polled.get(name, 0.0) >= POLL and not self._slurm.outstanding(name, "poll"):
                self._pool_polled[name] = now
                self._slurm.poll(name, partial(slurm.squeue, via=self._slurm_via(name)))
        with self._mu:
            self._refresh_pool_views(now)  # time_left, as of this tick
        if changed:
            self._save_pools()
            with self._mu:
                self._dirty = True  # a session again: the pend reasons say what the pools do now

    def _pool_polled_now(self, res: Polled, now: float) -> bool:
        """An squeue's answer for pool `res.pool`: Slurm's trouble, or each allocation brought up to date."""
        if res.jobs is None:
            before = self._pool_trouble.get(res.pool)
            if before is None or before[0] != res.error:
                self.log(f"pool {res.pool}: {res.error}")
            self._pool_trouble[res.pool] = (res.error or "", before[1] if before else now)
            return before is None
        changed = self._pool_trouble.pop(res.pool, None) is not None
        if changed:
            self.log(f"pool {res.pool}: Slurm answers again")
        seen = res.jobs
        by_name = {j.name: j for j in seen.values()}
        for r in [r for r in self._allocs if r.pool == res.pool and r.state in LIVE]:
            changed |= self._pool_update(r, seen, by_name, now, res.began)
        for r in self._allocs:
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
        self._pool_sending.discard((res.pool, res.seq))
        r = next((r for r in self._allocs if r.pool == res.pool and r.seq == res.seq), None)
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
            self._pool_trouble.setdefault(r.pool, (res.error or "", now))  # until an squeue answers
            self.log(f"pool {r.pool}: {res.error}; the allocation is looked for by its name "
                     f"{self._slurm_name(r.pool, r.seq)} (never submitted twice)")
        else:
            r.state, r.reason = "failed", res.error or "sbatch failed"
            self._pool_retry_at[r.pool] = now + SBATCH_BACKOFF
            self.log(f"pool {r.pool}: {r.reason}; trying again in {SBATCH_BACKOFF:g} s")
        return True

    def _slurm_name(self, pool: str, seq: int) -> str:
        return f"xce-{self.cluster}-{pool}-{seq}"

    def _pool_update(self, r: AllocRecord, seen: dict, by_name: dict, now: float, asked: float) -> bool:
        """One live allocation against what an squeue asked at `asked` says; True if its record changed."""
        before = asdict(r)
        if r.job_id is None:
            if (r.pool, r.seq) in self._pool_sending:
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
            self._pool_cancel_at[r.job_id] = now
            self._slurm.cancel(r.pool, r.job_id, partial(slurm.scancel, r.job_id, self._slurm_via(r.pool)))
        elif job.state != "SUSPENDED":
            r.state, r.reason = "pending", job.reason if job.reason != "None" else job.state.lower()
        return asdict(r) != before

    def _pool_linked(self, r: AllocRecord) -> bool:
        return all(name in self._links for name in r.host_names())

    def _pool_connect(self, r: AllocRecord) -> None:
        """Start the links of a running allocation's hosts (after its start, or a restart)."""
        pool = self._pool_config(r.pool)
        directory = self._pool_dir(pool) if pool is not None else None
        if directory is None:
            return  # the pool left the configuration: its allocations are only watched until they end
        agent, via = bundle.install(directory), self._via_target(pool.name)
        for name, node in zip(r.host_names(), r.nodes):
            if name in self._links:
                continue
            self._pool_host_of[name] = (r, node)

            def factory(name: str = name, node: str = node) -> SlurmHost:
                return SlurmHost(name, r.job_id, node, directory, agent, python=pool.python, nodelist=r.nodelist,
                                 direct=pool.connect == "direct", via=via)

            link = HostLink(name, factory, self._events, self.log, backoff_max=self.config.ssh.reconnect_max)
            with self._mu:
                self._links[name] = link
                self._host_state.setdefault(name, "unreachable")
                self._down_since.setdefault(name, time.time())
                self._dirty = True
            link.start()
        self.log(f"pool {r.pool}: allocation {r.job_id} runs on {r.nodelist}; connecting to "
                 + ", ".join(r.host_names()))

    def _pool_end(self, r: AllocRecord, why: str, now: float, ended_at: float | None = None) -> None:
        """The allocation has ended (at `ended_at`, as Slurm says; None: unknown): its hosts are
        gone, with every job on them (requeued), except a job whose end the journal on the shared
        file system holds from before the allocation's end (its report died with the relay: it
        counts). When Slurm no longer says when it ended, no such end counts: a requeue is safe."""
        r.state, r.reason, r.end_time = "ended", f"{why}; released: {r.release}" if r.release else why, now
        names = [n for n in r.host_names() if n in self._pool_host_of or n in self._links] if r.job_id else []
        late = self._pool_late_results(r, names, ended_at) if ended_at is not None else {}
        with self._mu:
            for (host, unit), result in late.items():
                if unit in self._by_unit:
                    self.log(f"pool {r.pool}: the end of unit {unit} on {host} (before its allocation's) is "
                             "read from its journal")
                    self._unit_finished(host, unit, result, now)
            victims = [j for j in self._active.values()
                       if not j.ending and any(a.host in names for a in j.holding.allocs)]
            for job in victims:
                reason = f"host {job.holding.allocs[0].host} lost: {why}"
                if self.config.controller.on_host_lost == "requeue":
                    job.ending = True
                    self._unrecorded_requeues.append(Requeue(job.id, job.state, reason))
                else:
                    self._end_job(job, EXIT, reason, "lost", now)
            for name in names:
                self._lost_hosts.add(name)
                self._host_state.pop(name, None)
                self._down_since.pop(name, None)
                self._down_why.pop(name, None)
                self._hosts.pop(name, None)
                self._pool_host_of.pop(name, None)
                for unit in [u for u, d in self._draining.items() if d.host == name]:
                    del self._draining[unit]  # Slurm ended it: nothing holds its share any more
            links = [self._links.pop(n) for n in names if n in self._links]
            self._dirty = True
        for link in links:  # off the tick: a relay may take its time to go
            threading.Thread(target=link.close, name=f"close-{link.name}", daemon=True).start()
        self.log(f"pool {r.pool}: allocation {r.job_id} ended: {why}"
                 + (f"; {len(victims)} job(s) {self.config.controller.on_host_lost}" if victims else ""))
        if victims:
            self._wake.set()

    def _pool_late_results(self, r: AllocRecord, names: list[str], ended_at: float) -> dict:
        """{(host, unit): result} of the units on `names` that ended before `ended_at`, by their
        nodes' journals. A unit Slurm's end killed ends later (or never records): not counted."""
        pool = self._pool_config(r.pool)
        if pool is None or not r.job_id:
            return {}
        directory = self._pool_dir(pool)
        out = {}
        for name, node in zip(r.host_names(), r.nodes):
            if name not in names:
                continue
            for unit, result in results_on_disk(directory, r.job_id, node).items():
                if result.end_time is not None and result.end_time < ended_at:
                    out[(name, unit)] = result
        return out

    def _pool_act(self, pool: PoolConfig, now: float) -> bool:
        """The policy's decision for `pool`, carried out; True if a record changed."""
        mine = [r for r in self._allocs if r.pool == pool.name and r.state in LIVE]
        with self._mu:
            views = {v.name: v for v in self._hosts_now()}
            busy_hosts = {a.host for j in self._active.values() for a in j.holding.allocs}
            busy_hosts |= {d.host for d in self._draining.values()}
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
        decision = policy.decide(shape, allocations, demand, now, self._pool_retry_at.get(pool.name))
        changed = False
        for job_id, why in decision.release:
            r = next(r for r in mine if r.job_id == job_id)
            if r.release is None:
                r.release, changed = why, True
                self.log(f"pool {pool.name}: releasing allocation {job_id}: {why}")
            sent = self._pool_cancel_at.get(job_id)
            if sent is None or now - sent > SBATCH_BACKOFF:  # not sent, failed, or Slurm did not act on it
                self._pool_cancel_at[job_id] = now
                self._slurm.cancel(pool.name, job_id, partial(slurm.scancel, job_id, self._slurm_via(pool.name)))
        for _ in range(decision.submit):
            self._pool_submit(pool, now)
            changed = True
        return changed

    def _pool_demand(self, pool: PoolConfig) -> list[policy.Demand]:
        """Jobs a scheduling session left pending that the pool's hosts may run (their queue allows
        the pool). Holds _mu. Counted up to what max_allocations could take."""
        allowed = {q.name for q in self.config.queues if q.hosts is None or pool.name in q.hosts}
        cap = pool.max_allocations * pool.slots * pool.nodes_per_allocation
        demand, slots = [], 0
        for job_id, reason in self._reasons.items():
            job = self._pending.get(job_id) if reason else None
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
        self._pool_seq += 1
        r = AllocRecord(pool.name, self._pool_seq, submit_time=now)
        self._allocs.append(r)
        self._save_pools()
        directory = self._pool_dir(pool)
        try:
            agent = bundle.install(directory)
        except OSError as err:
            r.state, r.reason = "failed", f"cannot write the agent into {directory}: {err}"
            self._pool_retry_at[pool.name] = now + SBATCH_BACKOFF
            self.log(f"pool {pool.name}: {r.reason}; trying again in {SBATCH_BACKOFF:g} s")
            return
        script = slurm.batch_script(pool.name, str(directory), pool.python, str(agent), pool.nodes_per_allocation,
                                    tcp=pool.connect == "direct")
        args = [*pool.sbatch_options(self._slurm_name(pool.name, r.seq)), f"--output={directory}/slurm-%j.out",
                f"--chdir={directory}"]
        self._pool_sending.add((pool.name, r.seq))
        self._slurm.submit(pool.name, r.seq, partial(slurm.sbatch, script, args, self._slurm_via(pool.name)))

    def _save_pools(self) -> None:
        ended: dict[str, int] = {}
        keep = []
        for r in reversed(self._allocs):  # newest first: keep the last KEEP_ENDED ended per pool
            if r.state not in LIVE:
                ended[r.pool] = ended.get(r.pool, 0) + 1
                if ended[r.pool] > KEEP_ENDED:
                    continue
            keep.append(r)
        self._allocs = keep[::-1]
        saved = {"seq": self._pool_seq, "allocations": [asdict(r) for r in self._allocs]}
        self.store.set_meta(META_KEY, json.dumps(saved))

    def _slurm_via(self, name: str) -> slurm.Runner | None:
        """Where pool `name`'s Slurm commands run: here (None), or its `via:` login host over SSH."""
        target = self._via_target(name)
        return slurm.over_ssh(target) if target is not None else None

    def _via_target(self, name: str):
        """The SshTarget of pool `name`'s `via:` login host; None for `via: local`."""
        from xce_lite.home.hostadd import ssh_target

        pool = self._pool_config(name)
        if pool is None or pool.via == "local":  # `local` is this machine, even beside a host named so
            return None
        host = next(h for h in self.config.hosts if h.name == pool.via)  # an ssh host: config checked it
        return ssh_target(host, self.config, self.home)

    def _pool_config(self, name: str) -> PoolConfig | None:
        return next((p for p in self.config.pools if p.name == name), None)

    def _pool_dir(self, pool: PoolConfig) -> Path:
        d = Path(pool.directory).expanduser() if pool.directory else self.home.root / "slurm" / pool.name
        d.mkdir(parents=True, exist_ok=True)
        return d
