"""The synthetic input of bench/scheduling.py (and of whatever else wants the same cluster): 500
hosts of three kinds, half of them full; 10,000 pending jobs of 20 request shapes as users write them,
in three queues; the licence counter; fair share and a project tree for [8]. Built with the real
value types from a fixed seed, so every run (and every tree) sees the same snapshot.
"""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tree this file is in, not whatever is installed

from xce_lite.config.sched_view import job_request
from xce_lite.sched import core, fairshare, projects
from xce_lite.sched.placement import GPUS, SLOTS, HostView
from xce_lite.sched.reasons import FrozenMap

SEED = 20240603
NOW = 1_700_000_000.0  # the session's clock, fixed: the same input gives the same decisions
G = 1024**3
QUEUES = (("short", 40), ("normal", 30), ("long", 20))
QUEUE_WEIGHTS = (20, 70, 10)
SHARED_TOTAL = {"lic_matlab": 64}

# (min tasks, max tasks, -R, weight): about 20 shapes, as users write them.
SHAPES = (
    (1, 1, "", 15),
    (1, 1, "rusage[mem=2G]", 10),
    (4, 4, "rusage[mem=1G] span[ptile=4]", 6),
    (2, 8, "select[avx512] rusage[mem=512M]", 6),
    (16, 16, "span[ptile=4] rusage[mem=1G]", 4),
    (16, 16, "span[hosts=1]", 4),
    (1, 1, "select[type==X86_64 && maxmem>=128G]", 5),
    (4, 4, "same[model] rusage[mem=2G]", 4),
    (1, 1, "order[-mem] rusage[mem=8G]", 5),
    (1, 1, "select[gpus>0] rusage[gpus=1:mem=8G]", 4),
    (2, 2, "select[gpus>=4] rusage[gpus=1:mem=16G] span[hosts=1]", 2),
    (1, 4, "select[model==EPYC] order[-slots]", 5),
    (8, 8, "rusage[mem=4G/host] span[ptile=4]", 3),
    (1, 1, "select[!avx512] rusage[mem=1G]", 5),
    (32, 32, "select[avx512 || model==XEON] span[ptile=8]", 2),
    (4, 16, "rusage[mem=1G] span[block=4]", 3),
    (1, 1, "rusage[mem=200G]", 2),
    (64, 64, "rusage[mem=2G] span[ptile=16] same[model]", 1),
    (2, 2, "select[defined(tmp)] rusage[tmp=20G/host:mem=1G]", 3),
    (1, 1, "rusage[lic_matlab=1/job:mem=4G]", 3),
)


def make_hosts(n: int, seed: int = SEED) -> tuple[HostView, ...]:
    """`n` hosts, 1 in 10 a GPU host (4 GPUs); exactly half full (0 free slots, no free GPU, a
    little memory left); the other half partly loaded. 1% of the full ones closed, 1% unreachable."""
    rng = random.Random(seed)
    full = set(rng.sample(range(n), n // 2))
    down = sorted(full)[: max(1, n // 50)]
    states = {i: ("closed" if k % 2 else "unreachable") for k, i in enumerate(down)}
    hosts = []
    for i in range(n):
        kind = i % 10
        if kind == 0:
            total, attrs, tags = {SLOTS: 32, "mem": 256 * G, GPUS: 4}, {"model": "A100"}, {"avx512", "nvme"}
        elif kind <= 5:
            total, attrs, tags = {SLOTS: 32, "mem": 128 * G, GPUS: 0, "tmp": 500 * G}, {"model": "EPYC"}, set()
            if i % 3 == 0:
                tags = {"avx512"}
        else:
            total, attrs, tags = {SLOTS: 16, "mem": 64 * G, GPUS: 0}, {"model": "XEON"}, {"avx512"}
        attrs["type"] = "AARCH64" if i % 20 == 7 else "X86_64"
        gpus = total[GPUS]
        if i in full:
            free = {SLOTS: 0, "mem": rng.randrange(0, total["mem"] // 4, G), GPUS: 0}
            gpu_free: tuple[int, ...] = ()
        else:
            used_slots = rng.randrange(0, total[SLOTS] // 2 + 1)
            used_gpus = rng.randrange(0, gpus // 2 + 1) if gpus else 0
            free = {SLOTS: total[SLOTS] - used_slots, "mem": total["mem"] - used_slots * 2 * G,
                    GPUS: gpus - used_gpus}
            gpu_free = tuple(range(used_gpus, gpus))
        if "tmp" in total:
            free["tmp"] = total["tmp"] - (0 if free[SLOTS] else 100 * G)
        hosts.append(HostView(f"h{i:04d}", states.get(i, "ok"), total, free, gpu_free, attrs, frozenset(tags)))
    return tuple(hosts)


def make_jobs(n: int, first_id: int = 1, seed: int = SEED) -> tuple[core.PendingJob, ...]:
    """`n` pending jobs with ids from `first_id`, shapes and queues drawn with a fixed seed. Each
    request goes through snapshot.job_request, as the controller builds it (one ResReq per -R text)."""
    rng = random.Random(seed * 7919 + first_id)
    weights = [w for *_, w in SHAPES]
    shapes = rng.choices(SHAPES, weights, k=n)
    queues = rng.choices([q for q, _ in QUEUES], QUEUE_WEIGHTS, k=n)
    jobs = []
    for k, ((lo, hi, text, _w), queue) in enumerate(zip(shapes, queues)):
        job_id = first_id + k
        request = job_request(job_id, lo, hi, (text,) if text else ())
        user = f"user{rng.randrange(40):02d}"
        jobs.append(core.PendingJob(job_id, user, queue, request, 0, NOW - 300 + job_id * 300 / (first_id + n)))
    return tuple(jobs)


def shared_free() -> FrozenMap:
    return FrozenMap({"lic_matlab": 40})


def base_snapshot(hosts, shared) -> core.Snapshot:
    """Everything but the jobs, as Controller._schedule builds it: queue policies (no host lists, no
    running limits here), no running usage by queue, a fixed `now` and the default starvation guard
    (600 s; the jobs were submitted in the last 5 minutes, so none holds a reservation)."""
    queues = tuple(core.QueuePolicy(name, priority) for name, priority in QUEUES)
    return core.Snapshot(tuple(hosts), (), queues, shared, (), NOW, 600.0)


def make_snapshot(hosts, jobs, shared) -> core.Snapshot:
    return dataclasses.replace(base_snapshot(hosts, shared), jobs=tuple(jobs))


def with_fairshare(snapshot: core.Snapshot) -> core.Snapshot:
    """[8a]: every queue fair-shared by user; users have past usage and slots running (fixed seed)."""
    rng = random.Random(SEED + 8)
    users = sorted({j.user for j in snapshot.jobs})
    usage = FrozenMap({u: rng.uniform(0, 500) * 3600 for u in users})
    running = FrozenMap({u: rng.randrange(0, 40) for u in users})
    shares = FrozenMap({u: 1 + rng.randrange(3) for u in users[:10]})
    policy = fairshare.FairShare(fairshare.USER, 7 * 86400.0, shares)
    fair = fairshare.FairShareInput(tuple(fairshare.QueueShare(name, policy, usage) for name, _p in QUEUES),
                                    FrozenMap({fairshare.USER: running}))
    return dataclasses.replace(snapshot, fairshare=fair)


def with_projects(snapshot: core.Snapshot) -> core.Snapshot:
    """[8b]: the jobs in 12 projects (3 roots, each with 3 children), limits on roots and children."""
    tree = []
    for r in range(3):
        tree.append(projects.Project(f"p{r}", limits=FrozenMap({"slots": 1500, "gpus": 40, "jobs": 900})))
        for c in range(3):
            tree.append(projects.Project(f"p{r}/c{c}", limits=FrozenMap({"slots": 600, "mem": 2000 * G})))
    paths = [p.path for p in tree]
    jobs = tuple(dataclasses.replace(j, project=paths[j.id % len(paths)]) for j in snapshot.jobs)
    held = tuple((p, FrozenMap({"slots": 100, "gpus": 5, "jobs": 50})) for p in paths)
    return dataclasses.replace(snapshot, jobs=jobs, projects=projects.Projects(tuple(tree)), project_held=held)
