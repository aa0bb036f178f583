"""The controller's host links: one per host of the configuration (and per pool host, pools.py),
each keeping its host connected in the background (exec/link.py), so that a slow or dead host never
stalls a tick. A part of the controller (`Controller.links`), given the shared state (whose `links`
it fills), the seams (how links and hosts are made), the home, the clock, the log and the
controller's event queue, where each link puts what its host says.

Invariant: a host with a link and no HostUp yet is `unreachable`, down since the link started.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from xce_lite.config.cluster import ClusterConfig, HostConfig
from xce_lite.controller.seams import Clock, Seams, real_host_factory
from xce_lite.controller.state import ControllerState
from xce_lite.home.paths import Home

LOCAL_SETTLE = 10.0  # seconds the controller waits for its local hosts' agents before it serves


class HostLinks:
    """See the module docstring."""

    def __init__(self, state: ControllerState, seams: Seams, home: Home, clock: Clock, log: Callable[[str], None],
                 events: queue.Queue) -> None:
        self.state, self.seams, self.home, self.clock, self.log, self.events = state, seams, home, clock, log, events

    def start(self, host: HostConfig) -> None:
        """Keep `host` connected from now on (exec/link.py); until it answers it is unreachable."""
        link = self.seams.link_factory(host.name, self._host_factory(host), self.events, self.log,
                                       backoff_max=self.state.config.ssh.reconnect_max)
        with self.state.mu:
            self.state.links[host.name] = link
            self.state.host_state.setdefault(host.name, "unreachable")
            if self.state.host_state[host.name] != "ok":
                self.state.down_since.setdefault(host.name, self.clock.time())
        link.start()

    def hosts_changed(self, old: ClusterConfig, new: ClusterConfig) -> None:
        """After a reconfig: connect added hosts, and reconnect hosts whose connection settings (or
        the cluster's ssh settings) changed; the new connection lists the host's units and the jobs
        on it go on. A removed host is closed to new work already (it is not in the scheduler's
        view); its link stays, so the results of the jobs still running there come back."""
        before = {h.name: h for h in old.hosts}
        for host in new.hosts:
            was = before.get(host.name)
            if was is not None and (_connection(was) == _connection(host) and old.ssh == new.ssh):
                continue
            link = self.state.links.pop(host.name, None)
            if link is not None:
                link.close()
            self.log(f"host {host.name}: {'added' if was is None else 'connection settings changed'}; connecting")
            self.start(host)
        removed = sorted(before.keys() - {h.name for h in new.hosts})
        if removed:
            self.log(f"hosts removed: {', '.join(removed)} (closed to new work; their running jobs go on)")

    def _host_factory(self, host: HostConfig) -> Callable[[], Any]:
        """How the host's link makes a fresh connection to it (the seams' own, or the real one)."""
        if self.seams.host_factory is not None:
            return self.seams.host_factory(host)
        return real_host_factory(host, self.state.config, self.home)

    def settle_local(self, tick: Callable[[], None], stopping: threading.Event) -> None:
        """Before serving: tick until each local host's agent has answered (or failed), for at most
        LOCAL_SETTLE seconds, so that `xce controller start; xce hosts` shows this machine ok. Remote
        hosts are never waited for: they connect in the background."""
        state = self.state
        local = [h.name for h in state.config.hosts if h.type == "local"]
        deadline = time.monotonic() + LOCAL_SETTLE
        while time.monotonic() < deadline and not stopping.is_set():
            if all(state.host_state.get(n) == "ok" or n in state.down_why for n in local):
                return
            state.wake.wait(0.05)
            state.wake.clear()
            tick()


def _connection(host: HostConfig) -> tuple:
    """What a host's connection depends on (its resources and tags apply without reconnecting)."""
    return (host.type, host.address, host.port, host.user, host.identity, host.python, host.spool, host.launch,
            host.unit_accounting)
