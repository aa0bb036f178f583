"""Helpers of the practice cluster's tests (`xce lab`, the harness's hosts): reach a host through
OpenSSH or paramiko, find the processes a lab directory left, read the PIDs the lab recorded."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import paramiko

from xce_lite import testhosts


def ssh(host: testhosts.TestHost, command: str) -> str:
    """Run `command` through OpenSSH and the ssh_config the harness wrote (as the caller)."""
    r = subprocess.run(host.ssh_argv(command), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"ssh {host.name} {command!r} exited {r.returncode}: {r.stderr}"
    return r.stdout


def paramiko_client(address: str, port: int, user: str, key: Path, known_hosts: Path) -> paramiko.SSHClient:
    """A paramiko connection (what the SSH transport uses) that trusts only `known_hosts`."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(address, port=port, username=user, key_filename=str(key), look_for_keys=False,
                   allow_agent=False, timeout=10)
    return client


def run(client: paramiko.SSHClient, command: str) -> str:
    _, out, err = client.exec_command(command, timeout=30)
    text = out.read().decode()
    assert out.channel.recv_exit_status() == 0, f"{command!r}: {err.read().decode()}"
    return text


def processes_referring_to(path: Path) -> list[int]:
    """PIDs whose command line or mounts name `path`: an unprivileged host's sshd, or any process in
    a namespaced host's mount namespace (its /etc/hostname is bound from there)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                text = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                text += Path(f"/proc/{entry}/mountinfo").read_text(errors="replace")
            except OSError:
                continue
            if str(path) in text:
                found.append(int(entry))
    return found


def recorded_pids(lab_dir: Path) -> list[tuple[int, int | None]]:
    return [(h["pid"], h["start"]) for h in json.loads((lab_dir / testhosts.STATE).read_text())["hosts"]]
