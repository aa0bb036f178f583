"""config.py: xce.yaml as pydantic models.

A broken file must produce a ConfigError that names the file, the field and the line, so the user
can go straight to it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.configs import config_file
from xce_lite.config.cluster import ClusterConfig, load_config
from xce_lite.config.init_file import default_config_text
from xce_lite.errors import ConfigError, SpecError

MiB, GiB = 1024**2, 1024**3

GOOD = """\
cluster: lab
hosts:
  - name: h1
    slots: 4
    mem: 8G
  - name: h2
    slots: 2
    mem: 4096
queues:
  - name: short
    priority: 50
  - name: normal
    default: true
  - name: long
    priority: 10
"""


def load_error(tmp_path: Path, text: str) -> tuple[Path, str]:
    path = config_file(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return path, str(caught.value)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth line of `text` that contains `needle`."""
    found = [number for number, line in enumerate(text.splitlines(), start=1) if needle in line]
    return found[nth - 1]


def reported_line(message: str, field: str) -> int:
    match = re.search(rf"{re.escape(field)} \(line (\d+)\)", message)
    assert match, f"field {field!r} with a line number not in:\n{message}"
    return int(match.group(1))


# ---- loading ----------------------------------------------------------------------------------


def test_a_good_file_loads(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, GOOD))
    assert config.cluster == "lab"
    assert [(h.name, h.slots, h.mem, h.type) for h in config.hosts] == [
        ("h1", 4, 8 * GiB, "local"), ("h2", 2, 4096 * MiB, "local")]  # a bare number is megabytes
    assert [(q.name, q.priority, q.default) for q in config.queues] == [
        ("short", 50, False), ("normal", 30, True), ("long", 10, False)]
    assert (config.controller.tick, config.controller.grace) == (1.0, 10.0)


def test_a_hosts_unit_accounting_reaches_its_agents_command_line(tmp_path: Path) -> None:
    """`unit_accounting: false` asks the agent to record systemd units' ends itself (`--records
    agent`); by default the units' stop command does (`--records unit`), with CPU time and memory."""
    from xce_lite.controller.seams import real_host_factory
    from xce_lite.home.paths import Home

    text = GOOD.replace("    mem: 4096\n", "    mem: 4096\n    unit_accounting: false\n")
    config = load_config(config_file(tmp_path, text))
    assert [h.unit_accounting for h in config.hosts] == [True, False]
    home = Home(tmp_path / "home")
    argvs = [real_host_factory(h, config, home)().agent_argv() for h in config.hosts]
    assert [argv[argv.index("--records") + 1] for argv in argvs] == ["unit", "agent"]


@pytest.mark.parametrize(
    ("host", "expected"),
    [("node-01", "node-01"), ("gpu.example.org", "gpu.example.org"), ("a", "a"),
     ("not a hostname!", "localhost"), ("-leading-dash", "localhost"), ("", "localhost")],
)
@pytest.mark.parametrize(("slots", "mem"), [(1, 64 * MiB), (8, 16 * GiB + 123), (256, 2 * 1024**4)])
def test_default_config_text_loads(tmp_path: Path, host: str, expected: str, slots: int, mem: int) -> None:
    text = default_config_text("xce", host, slots, mem)
    config = load_config(config_file(tmp_path, text))
    assert config.cluster == "xce"
    assert [(h.name, h.slots, h.mem, h.type) for h in config.hosts] == [(expected, slots, mem // MiB * MiB, "local")]
    assert config.default_queue.name == "normal"
    assert (config.controller.tick, config.controller.grace) == (1.0, 10.0)
    assert text.count("\n#") >= 3, "the file explains itself in comments"


NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", fullmatch=True)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("config")


@pytest.mark.parametrize("name", ["007", "1.5", "null", "on", "no", "true", "2024-01-01", "0x1f", "1_000"])
def test_default_config_text_keeps_names_yaml_would_read_as_other_types(tmp_path: Path, name: str) -> None:
    config = load_config(config_file(tmp_path, default_config_text(name, name, 2, GiB)))
    assert (config.cluster, config.hosts[0].name) == (name, name)


@given(cluster=NAMES, host=NAMES)
def test_default_config_text_keeps_any_valid_name(scratch: Path, cluster: str, host: str) -> None:
    config = load_config(config_file(scratch, default_config_text(cluster, host, 2, GiB)))
    assert (config.cluster, config.hosts[0].name) == (cluster, host)


# ---- errors name the file, the field and the line -----------------------------------------------


def test_duplicate_host_names(tmp_path: Path) -> None:
    text = GOOD.replace("name: h2", "name: h1")
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert "repeated: h1" in message
    assert line_of(text, "hosts:") <= reported_line(message, "hosts") <= line_of(text, "mem: 4096")


def test_two_default_queues(tmp_path: Path) -> None:
    text = GOOD.replace("priority: 10", "priority: 10\n    default: true")
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert "normal, long" in message
    assert line_of(text, "queues:") <= reported_line(message, "queues") <= len(text.splitlines())


def test_duplicate_queue_names(tmp_path: Path) -> None:
    text = GOOD.replace("name: long", "name: short")
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert "repeated: short" in message
    assert line_of(text, "queues:") <= reported_line(message, "queues") <= len(text.splitlines())


@pytest.mark.parametrize(
    ("text", "field", "needle"),
    [
        pytest.param(GOOD.replace("    mem: 4096", "    mem: 4096\n    colour: red"), "hosts.1.colour", "colour",
                     id="unknown-host-key"),
        pytest.param(GOOD.replace("  - name: long", "  - name: long\n    preemptive: yes"), "queues.2.preemptive",
                     "preemptive", id="unknown-queue-key"),
        pytest.param(GOOD + "colour: red\n", "colour", "colour", id="unknown-top-key"),
        pytest.param(GOOD + "contoller:\n  tick: 2s\n", "contoller", "contoller", id="unknown-top-key-with-block"),
        pytest.param(GOOD + "controller:\n  tick: 2s\n  grase: 5s\n", "controller.grase", "grase",
                     id="unknown-controller-key"),
    ],
)
def test_an_unknown_key_is_refused(tmp_path: Path, text: str, field: str, needle: str) -> None:
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert reported_line(message, field) == line_of(text, needle)
    assert "Extra inputs are not permitted" in message


@pytest.mark.parametrize("bad", ["lots", "4X", "0", "-1", "0M", "-1G", "true", "[4G]"])
def test_a_bad_size(tmp_path: Path, bad: str) -> None:
    text = GOOD.replace("mem: 8G", f"mem: {bad}")
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert reported_line(message, "hosts.0.mem") == line_of(text, f"mem: {bad}")


def test_a_bad_duration(tmp_path: Path) -> None:
    text = GOOD + "controller:\n  tick: soon\n"
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert reported_line(message, "controller.tick") == line_of(text, "tick: soon")
    assert "'soon' is not a duration" in message


def test_missing_hosts(tmp_path: Path) -> None:
    text = "# a cluster with no machines\ncluster: lab\nqueues:\n  - name: normal\n"
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    # a missing key has no line of its own: the mapping that should hold it
    assert reported_line(message, "hosts") == line_of(text, "cluster: lab")
    assert "Field required" in message


def test_empty_hosts(tmp_path: Path) -> None:
    text = "cluster: lab\nhosts: []\nqueues:\n  - name: normal\n"
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert reported_line(message, "hosts") == 2


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = GOOD.replace("slots: 4", "slots: 0").replace("mem: 4096", "mem: lots")
    _, message = load_error(tmp_path, text)
    assert reported_line(message, "hosts.0.slots") == line_of(text, "slots: 0")
    assert reported_line(message, "hosts.1.mem") == line_of(text, "mem: lots")


@pytest.mark.parametrize(
    ("text", "says"),
    [("cluster: [unclosed\n", "not valid YAML"), ("", "expected a mapping"), ("- a\n- b\n", "expected a mapping")],
)
def test_not_a_config_at_all(tmp_path: Path, text: str, says: str) -> None:
    path, message = load_error(tmp_path, text)
    assert str(path) in message and says in message


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    path = tmp_path / "xce.yaml"
    with pytest.raises(ConfigError, match="xce init") as caught:
        load_config(path)
    assert str(path) in str(caught.value)


# ---- queues -----------------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> ClusterConfig:
    return load_config(config_file(tmp_path, GOOD))


def test_no_queue_named_is_the_default_queue(config: ClusterConfig) -> None:
    assert config.queue(None).name == "normal"
    assert config.queue(None) is config.default_queue


def test_without_a_default_flag_the_first_queue_is_the_default(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, GOOD.replace("    default: true\n", "")))
    assert config.queue(None).name == "short"


def test_a_queue_by_name(config: ClusterConfig) -> None:
    assert config.queue("long").priority == 10


def test_an_unknown_queue_lists_the_known_ones(config: ClusterConfig) -> None:
    with pytest.raises(SpecError) as caught:
        config.queue("gpu")
    message = str(caught.value)
    assert "'gpu'" in message
    assert "short, normal, long" in message


# ---- ssh hosts ----------------------------------------------------------------------------------

SSH = """\
cluster: lab
hosts:
  - name: gpu1
    type: ssh
    address: 10.0.0.5
    port: 2222
    user: alice
    slots: 8
    mem: 32G
queues:
  - name: normal
ssh:
  config: /etc/xce/ssh_config
  known_hosts: [/etc/xce/known_hosts]
controller:
  host_lost_after: 2m
  lease: 1m
  lease_margin: 30s
  on_host_lost: exit
"""


def test_an_ssh_host_keeps_how_to_reach_it(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, SSH))
    host = config.hosts[0]
    assert (host.type, host.address, host.port, host.user, host.launch) == ("ssh", "10.0.0.5", 2222, "alice", "auto")
    assert host.agent_spool("lab") == "~/.xce-agent/lab-gpu1"
    assert (config.ssh.config, config.ssh.known_hosts) == ("/etc/xce/ssh_config", ["/etc/xce/known_hosts"])
    assert (config.controller.host_lost_after, config.controller.on_host_lost) == (120.0, "exit")


def test_ssh_settings_on_a_local_host_are_refused_with_the_fix(tmp_path: Path) -> None:
    text = GOOD.replace("    mem: 8G\n", "    mem: 8G\n    address: 10.0.0.5\n", 1)
    path, message = load_error(tmp_path, text)
    assert "address apply to ssh hosts only; add `type: ssh` to host h1" in message
    assert str(path) in message


@pytest.mark.parametrize("old, new, field", [
    ("type: ssh", "type: telnet", "hosts.0.type"),
    ("port: 2222", "port: 0", "hosts.0.port"),
    ("user: alice", "user: alice\n    launch: docker", "hosts.0.launch"),
    ("on_host_lost: exit", "on_host_lost: ignore", "controller.on_host_lost")])
def test_bad_ssh_host_values_are_refused(tmp_path: Path, old: str, new: str, field: str) -> None:
    _path, message = load_error(tmp_path, SSH.replace(old, new))
    assert field in message
