"""config/sched_view.HostsNow, the controller's cache of host views: after any sequence of jobs
starting and ending, hosts changing state and a new config, it gives what `hosts_now` computes
afresh, and the same object for a host nothing changed on."""

from __future__ import annotations

import random

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.sched_view import Holding, HostsNow, host_totals, hosts_now
from xce_lite.sched.reasons import FrozenMap, HostAlloc


def config(slots: int) -> ClusterConfig:
    return ClusterConfig.model_validate({
        "cluster": "c", "queues": [{"name": "normal", "default": True}],
        "hosts": [{"name": f"h{i}", "slots": slots, "mem": "8G", "gpus": 2 if i % 2 else 0} for i in range(6)]})


def test_the_cache_equals_a_fresh_computation_through_random_changes():
    rng = random.Random(15)
    totals = host_totals(config(8))
    cache = HostsNow()
    held: dict[int, Holding] = {}
    states: dict[str, str] = {h.name: "ok" for h in totals}
    for round_ in range(400):
        action = rng.random()
        if action < 0.45:
            hosts = rng.sample([h.name for h in totals], rng.randint(1, 2))
            held[round_] = Holding(tuple(
                HostAlloc(h, 1, FrozenMap({"slots": 1, "mem": rng.choice((0, 2**30))}),
                          (rng.randrange(2),) if int(h[1:]) % 2 and rng.random() < 0.3 else ()) for h in hosts))
        elif action < 0.85 and held:
            del held[rng.choice(sorted(held))]
        elif action < 0.97:
            states[rng.choice(sorted(states))] = rng.choice(("ok", "unreachable", "closed"))
        else:
            totals = host_totals(config(rng.choice((8, 16))))  # a reconfig: new total views
        got = cache(totals, states, list(held.values()))
        assert got == hosts_now(totals, states, list(held.values())), round_
    unchanged = cache(totals, states, list(held.values()))  # nothing changed: every host keeps its object
    assert all(a is b for a, b in zip(unchanged, got))
