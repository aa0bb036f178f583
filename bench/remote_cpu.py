"""CPU accounting of bench/remote.py's parties: processes by PID, the machine, a systemd test host's
cgroup (PID 1, sshd, the agent, the units), and the agents' and named processes' PIDs in the hosts'
namespaces. Reads /proc and /sys only; asserts nothing."""

from __future__ import annotations

import os
from pathlib import Path

from cluster import is_agent

from xce_lite import testhosts



def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """Each live process's own CPU seconds (user + system); one gone is left out."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / tick
    return found


def cpu_seconds(pids: list[int]) -> float:
    return sum(cpu_by_pid(pids).values())


def cpu_spent(before: dict[int, float], pids: list[int]) -> float:
    """CPU seconds the processes of `before` spent since, counting only those still alive: one
    that ended meanwhile (a reused supervisor let go) is left out rather than subtracted, which
    made the agents' figure negative (its CPU in the run is lost: a small undercount)."""
    return sum(now - before[pid] for pid, now in cpu_by_pid(pids).items() if pid in before)


class HostCgroupCpu:
    """CPU seconds so far of everything in a systemd test host (its cpuacct cgroup on this
    machine: PID 1, sshd, the agent, the units), or None where the host has none (plain hosts)."""

    def __init__(self, hosts: list[testhosts.TestHost]):
        mine = _cpuacct(os.getpid())
        found = [_cpuacct(h.pid) for h in hosts]
        paths = [p for p in found if p is not None and p != mine and p.exists()]
        self.paths = paths if len(paths) == len(hosts) else []  # all or nothing: no half figure

    def __call__(self) -> float | None:
        try:
            return sum(int(p.read_text()) for p in self.paths) / 1e9 if self.paths else None
        except OSError:
            return None


class HostCpu:
    """CPU seconds so far of everything in one test host: its cpuacct cgroup on this machine."""

    def __init__(self, host: testhosts.TestHost):
        path = _cpuacct(host.pid)
        if path is None:
            raise RuntimeError(f"test host {host.name}: no cpuacct cgroup on this machine to read its CPU from")
        self.path = path

    def __call__(self) -> float:
        return int(self.path.read_text()) / 1e9


def _cpuacct(pid: int) -> Path | None:
    try:
        line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                    if "cpuacct" in x.split(":")[1].split(","))
    except (OSError, StopIteration):
        return None
    controllers, path = line.split(":")[1], line.split(":", 2)[2]
    return Path(f"/sys/fs/cgroup/{controllers}{path}/cpuacct.usage")


def agent_pids(hosts: list[testhosts.TestHost]) -> list[int]:
    found = []
    for host in hosts:
        for pid in testhosts.namespace_pids(host.pid):
            try:
                argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
            except OSError:
                continue
            if is_agent(argv):
                found.append(pid)
    return found


def named_pids(hosts: list[testhosts.TestHost], comm: str) -> list[int]:
    return [pid for h in hosts for pid in testhosts.namespace_pids(h.pid) if testhosts._comm(pid) == comm]
