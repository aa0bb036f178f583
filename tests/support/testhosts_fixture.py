"""pytest plugin: real test hosts (xce_lite.testhosts) for a test session.

Load it from a conftest.py with `pytest_plugins = ["tests.support.testhosts_fixture"]`, or on the
command line with `-p tests.support.testhosts_fixture`.

Fixtures; the host ones are session-scoped, booted on first use and stopped by PID at the session's end:
- `require_testhosts`: a function, `require_testhosts(plain=False)`, for a test that boots its own.
- `testhosts_root`: this session's directory, outside /tmp (the hosts have their own /tmp, so they
  would not see pytest's tmp_path): $XCE_TESTHOSTS_DIR or ~/.cache/xce-testhosts, then pytest-<pid>/.
  Files a test shares with the hosts go there.
- `systemd_hosts`: [host1, host2], each a systemd (PID 1 of its namespaces) with sshd on its own
  loopback address; `plain_hosts`: [host1] with no systemd (PID 1 is `sleep infinity`) and sshd.
  Each is a list of TestHost; `host.dir` holds ssh_config, known_hosts and the key id_ed25519.

They skip, with the reason and the remedy, where test hosts cannot run (not root; unshare, nsenter or
sshd missing). With XCE_REQUIRE_TESTHOSTS=1 (as in CI) they fail instead: a green run then proves the
hosts ran. A host that should boot here and does not is always an error, never a skip.

The hosts die with the pytest process even when it is killed (setpriv --pdeathsig + unshare
--kill-child); what such a session leaves (cgroups, address claims, files) the next session clears.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from xce_lite import testhosts
from xce_lite.testhosts import TestHost

REQUIRE_ENV = "XCE_REQUIRE_TESTHOSTS"
DIR_ENV = "XCE_TESTHOSTS_DIR"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes")


def require_testhosts(plain: bool = False) -> None:
    """Skip the calling test (fail it with XCE_REQUIRE_TESTHOSTS=1) unless test hosts can run here."""
    problems = testhosts.missing_prerequisites(plain=plain)
    if not problems:
        return
    reason = "test hosts cannot run here: " + "; ".join(problems)
    if not required():  # a machine without them may skip; CI (XCE_REQUIRE_TESTHOSTS=1) may not
        pytest.skip(reason)
    pytest.fail(f"{reason} ({REQUIRE_ENV}=1 forbids skipping)", pytrace=False)


def _base() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    base = Path.home() / ".cache" / "xce-testhosts"
    try:
        testhosts._check_dir(base)
    except testhosts.TestHostError:  # a HOME under /tmp: the hosts would not see it
        base = Path("/var/cache/xce-testhosts")
    return base


def _owner_line(pid: int) -> str:
    return f"{pid} {testhosts._start_time(pid)}\n"


def _clear_dead_sessions(base: Path) -> None:
    """Take down what sessions whose pytest is gone left under `base` (their recorded PIDs only)."""
    for old in base.glob("pytest-*"):
        try:
            pid_text, start_text = (old / "owner").read_text().split()
            pid, start = int(pid_text), int(start_text) if start_text != "None" else None
        except (OSError, ValueError):
            continue  # not ours to judge, or still being made
        if testhosts._alive(pid, start):
            continue
        for state in old.glob(f"*/{testhosts.STATE}"):
            with contextlib.suppress(testhosts.TestHostError, OSError):
                testhosts.down(state.parent)
        shutil.rmtree(old, ignore_errors=True)


@pytest.fixture(name="require_testhosts")
def require_testhosts_fixture():
    """`require_testhosts(plain=False)`: skip (or fail, with XCE_REQUIRE_TESTHOSTS=1) unless hosts can run."""
    return require_testhosts


@pytest.fixture(scope="session")
def testhosts_root() -> Iterator[Path]:
    require_testhosts(plain=True)
    base = _base()
    base.mkdir(parents=True, exist_ok=True)
    _clear_dead_sessions(base)
    root = base / f"pytest-{os.getpid()}"
    if root.exists():  # a session of an earlier process with this PID
        for state in root.glob(f"*/{testhosts.STATE}"):
            testhosts.down(state.parent)
        shutil.rmtree(root)
    root.mkdir()
    (root / "owner").write_text(_owner_line(os.getpid()))
    try:
        yield root
    finally:
        leftovers = [state.parent for state in root.glob(f"*/{testhosts.STATE}")]
        for d in leftovers:  # hosts a test started and did not stop
            testhosts.down(d)
        shutil.rmtree(root, ignore_errors=True)


def _hosts(root: Path, name: str, n: int, plain: bool) -> Iterator[list[TestHost]]:
    require_testhosts(plain=plain)
    d = root / name
    started = testhosts.up(n, d, plain=plain, die_with_caller=True)
    try:
        yield started
    finally:
        testhosts.down(d)


@pytest.fixture(scope="session")
def systemd_hosts(testhosts_root: Path) -> Iterator[list[TestHost]]:
    """Two hosts, each a real systemd with sshd: host1 and host2."""
    yield from _hosts(testhosts_root, "systemd", 2, plain=False)


@pytest.fixture(scope="session")
def plain_hosts(testhosts_root: Path) -> Iterator[list[TestHost]]:
    """One host without systemd (PID 1 is sleep), with sshd: host1."""
    yield from _hosts(testhosts_root, "plain", 1, plain=True)
