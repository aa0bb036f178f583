"""Shared by the trust tests (issue 13): a cluster of two local hosts, and what they read of it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.cluster import Cluster, running_cluster

LOCAL_HOSTS = """\
cluster: tf{pid}
hosts:
  - {{name: a, slots: 1, mem: 1G, tags: [ha]}}
  - {{name: b, slots: 1, mem: 1G, tags: [hb]}}
queues:
  - {{name: normal, default: true}}
controller:
  tick: 1s
  grace: 1s
  host_lost_after: {lost_after}
  lease: 20s
  lease_margin: 2s
"""


@contextmanager
def two_local_hosts(lost_after: str = "3s") -> Iterator[Cluster]:
    """A running cluster of hosts a and b (tags ha, hb), each with an agent of its own."""
    with running_cluster(config=LOCAL_HOSTS.format(pid=os.getpid(), lost_after=lost_after)) as c:
        yield c


def status(c: Cluster) -> dict:
    return json.loads(c.ok("controller", "status", "--json"))


def store_problem(c: Cluster) -> str | None:
    found = [p for p in status(c).get("problems", []) if p["what"] == "store"]
    return found[0]["why"] if found else None


def history(c: Cluster, job_id: int) -> list[str]:
    """The kinds of the job's events, oldest first."""
    job = json.loads(c.ok("jobs", "-l", "--json", str(job_id)))["jobs"][0]
    return [event["kind"] for event in job["history"]]


def runs(log) -> list[str]:
    """What the job's copies wrote to `log`, one word each (their XCE_ATTEMPT)."""
    return log.read_text().split() if log.exists() else []
