"""The controller's API routes for seeing the cluster: `/metrics` (what Prometheus text is made of),
`/usage` (utilisation and queue length over the last hours), `/accounting` (usage per user and queue
per day) and `/flows/list` (the caller's flows).

A part of the controller (`Controller.metrics_api`), given the shared state, the store, the clock,
the counters, the gate and what is free on the hosts now. Everything here only reads: the shared
state under its lock (hosts, pending reasons) and the store (counts, times). The numbers are aggregates
that `xce hosts` and `xce jobs -u all` show anyone already; a flow list is the caller's own.
The reply is JSON, as every route's: the client side renders the Prometheus text
(api/prometheus.py), so `xce metrics` and `xce web` print the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.controller.handlers.accounting import AccountingRoutes
from xce_lite.controller.metrics import REASON_KINDS, Registry, reason_kind
from xce_lite.controller.seams import Clock
from xce_lite.controller.shared import Handler
from xce_lite.controller.state import ControllerState
from xce_lite.models import FINISHED_STATES, PEND, STATES
from xce_lite.sched.placement import HostView
from xce_lite.store.usage import MAX_POINTS, series
from xce_lite.workflow.gate import Gate

UNFINISHED = tuple(s for s in STATES if s not in FINISHED_STATES)


class MetricsRoutes:
    """See the module docstring; the accounting routes (xce hist, xce acct) come with these."""

    def __init__(self, state: ControllerState, store: Any, clock: Clock, metrics: Registry, gate: Gate,
                 hosts_now: Callable[[], tuple[HostView, ...]]) -> None:
        self.state, self.store, self.clock, self.metrics, self.gate = state, store, clock, metrics, gate
        self.hosts_now = hosts_now
        self.accounting = AccountingRoutes(store)

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            **self.accounting.routes(),
            ("GET", "/metrics"): self.api_metrics,
            ("GET", "/usage"): self.api_usage,
            ("GET", "/accounting"): self.api_accounting,
            ("GET", "/flows/list"): self.api_flow_list,
        }

    def api_metrics(self, caller: Caller, query: dict, body: Any) -> dict:
        counts = self.store.counts_by_queue()
        queues = sorted({q.name for q in self.state.config.queues} | {queue for queue, _state in counts})
        jobs = [{"queue": q, "state": s, "count": counts.get((q, s), 0)} for q in queues for s in UNFINISHED]
        with self.state.mu:
            views = self.hosts_now()
            state = dict(self.state.host_state)
            lost = set(self.state.lost_hosts)
            gated = len(self.gate) - len(self.gate.fed)
            waiting = len(self.state.pending) + gated
            kinds = dict.fromkeys(REASON_KINDS, 0)
            known = 0
            for job_id, reason in self.state.reasons.items():
                if job_id in self.state.pending or job_id in self.gate:
                    kinds[reason_kind(PEND, reason)] += 1
                    known += 1
            kinds["new"] += max(0, waiting - known)
            kinds["held"] += len(self.state.held)
        hosts = []
        for v in views:
            up = state.get(v.name) == "ok"
            hosts.append({"name": v.name, "state": "up" if up else ("lost" if v.name in lost else "unreach"),
                          "resources": {name: {"total": total, "used": total - v.free[name]}
                                        for name, total in sorted(v.total.items())}})
        return {"schema": 1, "cluster": self.state.cluster, "time": self.clock.time(),
                "registry": self.metrics.snapshot(), "jobs": jobs, "pending_reasons": kinds, "hosts": hosts}

    def api_usage(self, caller: Caller, query: dict, body: Any) -> dict:
        """[[t, busy slots, running, waiting], ...] over the last `hours` (default 6) by `step`
        seconds (default: 200 points), with the slots the hosts offer now."""
        hours = _number(query, "hours", 6.0, 1 / 60, 24 * 31)
        step = _number(query, "step", hours * 3600 / 200, 1.0, 86400.0)
        if hours * 3600 / step > MAX_POINTS:
            raise errors.SpecError(f"{hours:g} hours by {step:g} s steps are more than {MAX_POINTS} points; "
                                   f"take a longer step")
        now = self.clock.time()
        since = now - hours * 3600
        points = series(self.store.usage_rows(since, now), since, now, step)
        with self.state.mu:
            views = self.hosts_now()
        slots = sum(v.total.get("slots", 0) for v in views if v.state == "ok")
        return {"schema": 1, "since": since, "until": now, "step": step, "slots_total": slots,
                "columns": ["time", "busy_slots", "running", "waiting"], "points": points}

    def api_accounting(self, caller: Caller, query: dict, body: Any) -> dict:
        """Usage per day, user and queue of the jobs that ended in the last `days` (default 7)."""
        days = _number(query, "days", 7.0, 1.0, 366.0)
        since = self.clock.time() - days * 86400
        return {"schema": 1, "since": since, "days": days, "by": ["user", "queue"],
                "rows": self.store.usage_by_day(since)}

    def api_flow_list(self, caller: Caller, query: dict, body: Any) -> dict:
        return {"schema": 1, "flows": self.store.flows_of(caller.user)}


def _number(query: dict, name: str, default: float, low: float, high: float) -> float:
    text = query.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise errors.SpecError(f"{name} must be a number, not {text!r}") from None
    if not low <= value <= high:
        raise errors.SpecError(f"{name} must be from {low:g} to {high:g}, not {value:g}")
    return value

