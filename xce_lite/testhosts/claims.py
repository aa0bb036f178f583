"""Loopback addresses for test hosts, claimed machine-wide so parallel harnesses never share one."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from xce_lite.testhosts.base import (
    CLAIMS_ENV,
    DEFAULT_CLAIMS,
    DEFAULT_FIRST_IP,
    FIRST_IP_ENV,
    SSH_PORT,
    TestHostError,
    _alive,
    _start_time,
)

# ---------------------------------------------------------------------------------------------------
# loopback addresses, claimed machine-wide


def _claims_dir() -> Path:
    return Path(os.environ.get(CLAIMS_ENV, DEFAULT_CLAIMS))


@contextlib.contextmanager
def _claims_locked() -> Iterator[Path]:
    d = _claims_dir()
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield d


def _claim_owner_alive(claim: Path) -> bool:
    try:
        data = json.loads(claim.read_text())
        return _alive(int(data["pid"]), data.get("start"))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _port_free(ip: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, SSH_PORT))
        except OSError:
            return False
    return True


def _wildcard_ssh_listener() -> bool:
    """Something (a system sshd?) listens on 0.0.0.0:22, which takes port 22 on every loopback address."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(f.split()[1] == "00000000:0016" and f.split()[3] == "0A" for f in lines)


def _parse_first_ip(first_ip: str | int | None) -> ipaddress.IPv4Address | None:
    if first_ip is None or first_ip == "":
        return None
    text = str(first_ip)
    if text.isdigit():  # as the recipe's TESTHOSTS_FIRST_IP: the last number, 21 -> 127.0.0.21
        text = f"127.0.0.{text}"
    ip = ipaddress.IPv4Address(text)
    if not ip.is_loopback:
        raise TestHostError(f"test hosts only use loopback addresses (127.0.0.0/8), not {ip}")
    return ip


def _usable(ip: ipaddress.IPv4Address) -> bool:
    last = int(ip) & 0xFF
    return ip.is_loopback and 0 < last < 255 and ip != ipaddress.IPv4Address("127.0.0.1")


def _write_claim(path: Path, dir: Path, pid: int) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(json.dumps({"dir": str(dir), "pid": pid, "start": _start_time(pid)}))
    os.replace(tmp, path)


def _why_taken(claims: Path, ip: str, dir: Path) -> str | None:
    """Why `ip` is not free for the hosts of `dir`, or None when it is."""
    claim = claims / ip
    if claim.exists():
        try:
            data = json.loads(claim.read_text())
        except (OSError, ValueError):
            data = {}
        if data.get("dir") != str(dir) and _claim_owner_alive(claim):
            return f"the test hosts of {data.get('dir')} claim it"
    if not _port_free(ip):
        why = "port 22 on it is in use"
        if _wildcard_ssh_listener():
            why += (" (something listens on 0.0.0.0:22, a system sshd? It takes port 22 on every loopback "
                    "address: stop it, e.g. systemctl disable --now ssh.service)")
        return why
    return None


def claim_ips(n: int, dir: Path, first_ip: str | int | None = None) -> list[str]:
    """Claim n consecutive free loopback addresses for the hosts of `dir`.

    With `first_ip` the block starts exactly there (or this raises); without, it is the first free
    block from $XCE_TESTHOSTS_FIRST_IP or 127.0.0.11 up. An address is free when no live harness
    claims it and port 22 on it can be bound. The claim is this process's until `up` hands it to
    the host.
    """
    explicit = _parse_first_ip(first_ip)
    start = explicit or _parse_first_ip(os.environ.get(FIRST_IP_ENV)) or ipaddress.IPv4Address(DEFAULT_FIRST_IP)
    last = ipaddress.IPv4Address("127.255.255.254")
    with _claims_locked() as claims:
        ip = start
        block: list[str] = []
        while len(block) < n:
            if ip > last:
                raise TestHostError(f"no block of {n} free loopback addresses from {start} on")
            if _usable(ip):
                why = _why_taken(claims, str(ip), dir)
                if why is None:
                    block.append(str(ip))
                elif explicit is not None:
                    raise TestHostError(f"{ip} is not free for test hosts: {why}")
                elif "0.0.0.0:22" in why:
                    raise TestHostError(f"no loopback address is free for test hosts: {why}")
                else:
                    block = []  # a block is consecutive: start again after this one
            elif explicit is not None:
                raise TestHostError(f"{ip} cannot be a test host's address (127.0.0.1, or a last number 0 or 255)")
            else:
                block = []
            ip += 1
        for a in block:
            _write_claim(claims / a, dir, os.getpid())
        return block


def release_ips(dir: Path, ips: list[str]) -> None:
    """Give back the addresses `claim_ips` claimed for the hosts of `dir`."""
    if not ips:
        return  # and without root, touch no claims directory
    with _claims_locked() as claims:
        for ip in ips:
            claim = claims / ip
            with contextlib.suppress(OSError, ValueError):
                if json.loads(claim.read_text()).get("dir") == str(dir):
                    claim.unlink()


def _hand_claims(dir: Path, owners: dict[str, int]) -> None:
    with _claims_locked() as claims:
        for ip, pid in owners.items():
            _write_claim(claims / ip, dir, pid)
