"""A real controller driving real sshd + systemd test hosts: the cluster config that reaches them
over SSH, a started cluster whose jobs run in a directory the hosts share, and the teardown that
kills what a test left on the hosts (they outlive the controller) before stopping the controller;
and two hosts of a test's own, for the tests that break one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator, Sequence
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


def started_cluster(config: str, root: Path, hosts: Sequence[testhosts.TestHost] = ()) -> Cluster:
    """`hosts`: the test hosts of `config` whose side a failed test's report shows (host_report)."""
    c = Cluster(config=config, work=root / f"work-{uuid.uuid4().hex[:8]}")
    match = re.search(r"^cluster: (\S+)$", config, re.M)
    for host in hosts:
        if match is not None:
            spool = Path(os.path.expanduser(f"~{host.user}")) / ".xce-agent" / f"{match.group(1)}-{host.name}"
            c.reporters.append(lambda host=host, spool=spool: host_report(host, spool))
    c.start()
    return c


def host_report(host: testhosts.TestHost, spool: Path, records: int = 40) -> str:
    """A test host's side, for a failed test's report: its processes (state and wait channel: a
    frozen sshd shows T), the agent's spool (lease, last journal records, each unit directory's
    files) and, on a systemd host, the last lines of its systemd journal. The hosts share the
    machine's file system but /run (where journald writes): read through PID 1's root."""
    parts = [f"---- test host {host.name} ({host.ip}, PID 1 {host.pid})"]
    for pid in testhosts.namespace_pids(host.pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parts.append(f"  {pid} {stat[0]} {wchan or '-'} {cmd[:160]}")
    parts.append(f"---- its spool {spool}")
    for name in ("lease",):
        with contextlib.suppress(OSError):
            parts.append(f"{name}: {(spool / name).read_text(errors='replace').strip()}")
    with contextlib.suppress(OSError):
        lines = (spool / "journal").read_text(errors="replace").splitlines()[-records:]
        parts.append("journal (its last records):\n" + "\n".join(line[:400] for line in lines if line))
    with contextlib.suppress(OSError):
        for unit in sorted((spool / "units").iterdir()):
            files = {f.name: f for f in unit.iterdir()} if unit.is_dir() else {}
            finished = files.get("finished")
            text = finished.read_text(errors="replace").strip()[:400] if finished else "(no finished file)"
            parts.append(f"units/{unit.name}: {' '.join(sorted(files))}; {text}")
    if host.systemd:
        journal = Path(f"/proc/{host.pid}/root/run/log/journal")
        out = subprocess.run(["journalctl", "-D", str(journal), "-n", "400", "--no-pager", "-o", "short-precise"],
                             capture_output=True, text=True, timeout=30)
        lines = [line for line in out.stdout.splitlines() if " kernel: " not in line][-80:]  # the machine's kmsg
        parts.append("---- its systemd journal (last lines)\n" + "\n".join(lines) + out.stderr)
    return "\n".join(parts)


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
