"""A real controller driving real sshd + systemd test hosts: the cluster config that reaches them
over SSH, a started cluster whose jobs run in a directory the hosts share, and the teardown that
kills what a test left on the hosts (they outlive the controller) before stopping the controller;
and two hosts of a test's own, for the tests that break one.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.cluster import Cluster
from xce_lite import testhosts


def ssh_host_entries(hosts: list[testhosts.TestHost], slots: int = 2, more: str = "") -> str:
    """`more`: further fields of each host's entry (`, name: value`...)."""
    return "".join(f"  - {{name: {h.name}, type: ssh, address: '{h.ip}', user: root, identity: '{h.key_path}', "
                   f"slots: {slots}, mem: 1G{more}}}\n" for h in hosts)


def remote_config(hosts: list[testhosts.TestHost], lost_after: str = "5m", keepalive: str = "15s",
                  lease: str = "3m", margin: str = "1m", more: str = "", host_more: str = "") -> str:
    """`more`: further `controller:` lines (each indented by two spaces, ending in a newline);
    `host_more`: further fields of each host's entry (ssh_host_entries)."""
    known = sorted({str(h.known_hosts_path) for h in hosts})
    return (f"cluster: rm{os.getpid()}\nhosts:\n{ssh_host_entries(hosts, more=host_more)}"
            f"queues:\n  - {{name: normal, default: true}}\n"
            f"ssh:\n  config: /nonexistent\n  known_hosts: {json.dumps(known)}\n  keepalive: {keepalive}\n"
            f"  reconnect_max: 2s\n"
            f"controller:\n  tick: 1s\n  grace: 1s\n  host_lost_after: {lost_after}\n"
            f"  lease: {lease}\n  lease_margin: {margin}\n{more}")


def started_cluster(config: str, root: Path) -> Cluster:
    c = Cluster(config=config, work=root / f"work-{uuid.uuid4().hex[:8]}")
    c.start()
    return c


def close(c: Cluster) -> None:
    """Kill what the test left running on the hosts (they outlive the controller), then stop it."""
    try:
        unfinished = json.loads(c.ok("jobs", "--json", "-u", "all"))["jobs"]
        if unfinished:
            c.xce("kill", *[str(j["id"]) for j in unfinished])
            c.xce("wait", "--timeout", "30", *[str(j["id"]) for j in unfinished])
    finally:
        c.close()


def sshd_pids(host: testhosts.TestHost) -> list[int]:
    return [pid for pid in testhosts.namespace_pids(host.pid) if testhosts._comm(pid) == "sshd"]


@contextmanager
def two_hosts_of_their_own(root: Path, tag: str, plain: bool) -> Iterator[list[testhosts.TestHost]]:
    """Hosts a1 and b1 (plain or systemd), each in a directory of its own under `root`, so that one
    can be cut off or killed alone; both are taken down when the block ends."""
    dirs = [root / f"{tag}-{prefix}-{uuid.uuid4().hex[:6]}" for prefix in ("a", "b")]
    booted: list[testhosts.TestHost] = []
    try:
        for prefix, d in zip(("a", "b"), dirs):
            booted += testhosts.up(1, d, plain=plain, die_with_caller=True, prefix=prefix)
        yield booted
    finally:
        for d in dirs:
            testhosts.down(d)
