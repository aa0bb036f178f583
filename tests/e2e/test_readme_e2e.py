"""The README's blocks that need root and namespaces, run as printed: the practice cluster in a
fresh home, and "Adding a real host" against a real test host (its address, port, user and key
put where the README has the reader's own). How blocks are marked and checked:
tests/support/readme.py; the others run in tests/project/test_readme.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import readme
from xce_lite.home import clusters

pytest_plugins = ["tests.support.testhosts_fixture"]

BLOCKS = readme.blocks()
LAB = [b for b in BLOCKS if b.kind == "run" and "e2e" in b.options]
HOST = [b for b in BLOCKS if b.kind == "run" and "e2e-host" in b.options]


@pytest.fixture
def fresh_home(testhosts_root: Path, request):
    """A new user's home outside /tmp (the hosts share the file system, not /tmp)."""
    root = testhosts_root / f"readme-{request.node.name[-12:].strip('[]')}"
    home = root / "home"
    home.mkdir(parents=True)
    env = readme.environment(home, readme.shims(root / "bin"))
    try:
        yield home, env
    finally:
        readme.stop_home(home / ".xce", env)
        name = clusters.cluster_of(home / ".xce")
        for left in clusters.agent_root().glob(f"{name}-*") if name else ():
            shutil.rmtree(left, ignore_errors=True)  # what an agent of this cluster kept on a test host
        shutil.rmtree(root, ignore_errors=True)


def test_there_are_blocks_for_the_lab_and_for_a_host_of_ones_own():
    assert len(LAB) == 1 and len(HOST) == 1


@pytest.mark.parametrize("block", LAB, ids=[f"line{b.line}" for b in LAB])
def test_the_practice_cluster_block_runs_as_printed(block, fresh_home, require_testhosts):
    require_testhosts(plain=True)
    home, env = fresh_home
    wrong = readme.problems(readme.run(block, home, env), home)
    assert not wrong, "\n\n".join(wrong)
    name = clusters.cluster_of(home / ".xce")
    assert name and not list(clusters.agent_root().glob(f"{name}-lab*")), "lab down left the agents' directories"


@pytest.mark.parametrize("block", HOST, ids=[f"line{b.line}" for b in HOST])
def test_adding_a_host_of_ones_own_runs_as_printed_against_a_test_host(block, fresh_home, plain_hosts):
    home, env = fresh_home
    (host,) = plain_hosts
    reader = "--address 10.0.0.5 --user alice"
    ours = f"--address {host.ip} --port {host.port} --user {host.user} --identity {host.key_path}"

    def rewrite(text: str) -> str:
        return text.replace(reader, ours).replace("10.0.0.5", host.ip)

    assert all(reader in c.text for c in block.commands()[:2])
    outcomes = readme.run(block, home, env, prelude=["xce quickstart >/dev/null 2>&1"], rewrite=rewrite)
    wrong = readme.problems(outcomes, home, rewrite=rewrite)
    assert not wrong, "\n\n".join(wrong)
