"""config_edit: hosts added to and removed from a real xce.yaml keep the user's text; known_hosts lines.

Table-driven: each case is a file as a user might write it and the exact text expected after the edit.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.support.configs import config_file
from xce_lite.config.cluster import load_config
from xce_lite.errors import ConfigError
from xce_lite.home import config_edit

LAB1 = {"name": "lab1", "type": "ssh", "address": "127.0.0.1", "port": 2201, "slots": 2, "mem": "1G",
        "tags": ["lab"]}
LAB2 = dict(LAB1, name="lab2", port=2202)

QUEUES = "queues:\n  - {name: normal, default: true}\n"

BLOCK = """\
# my cluster
cluster: 'c1'   # keep this quoting

hosts:
  - name: local     # the controller's machine
    slots: 4
    mem: 8G
  # a comment between the hosts and the queues

# Queues
""" + QUEUES
BLOCK_ADDED = """\
# my cluster
cluster: 'c1'   # keep this quoting

hosts:
  - name: local     # the controller's machine
    slots: 4
    mem: 8G
  - name: lab1  # xce lab
    type: ssh
    address: 127.0.0.1
    port: 2201
    slots: 2
    mem: 1G
    tags: [lab]
  - name: lab2  # xce lab
    type: ssh
    address: 127.0.0.1
    port: 2202
    slots: 2
    mem: 1G
    tags: [lab]
  # a comment between the hosts and the queues

# Queues
""" + QUEUES

FLOW_ITEMS = """\
cluster: c1
hosts:
- {name: a, slots: 1, mem: 1G}   # first
- {name: b, slots: 1, mem: 1G}
""" + QUEUES
FLOW_ITEMS_ADDED = """\
cluster: c1
hosts:
- {name: a, slots: 1, mem: 1G}   # first
- {name: b, slots: 1, mem: 1G}
- {name: lab1, type: ssh, address: 127.0.0.1, port: 2201, slots: 2, mem: 1G, tags: [lab]}  # xce lab
- {name: lab2, type: ssh, address: 127.0.0.1, port: 2202, slots: 2, mem: 1G, tags: [lab]}  # xce lab
""" + QUEUES

FLOW_LIST = "cluster: c1\nhosts: [{name: a, slots: 1, mem: 1G}]  # one host\n" + QUEUES
FLOW_LIST_ADDED = ("cluster: c1\nhosts: [{name: a, slots: 1, mem: 1G}, "
                   "{name: lab1, type: ssh, address: 127.0.0.1, port: 2201, slots: 2, mem: 1G, tags: [lab]}, "
                   "{name: lab2, type: ssh, address: 127.0.0.1, port: 2202, slots: 2, mem: 1G, tags: [lab]}]"
                   "  # one host\n" + QUEUES)

MULTILINE_FLOW = "cluster: c1\nhosts: [\n  {name: a, slots: 1, mem: 1G},\n  {name: b, slots: 1, mem: 1G}\n]\n" + QUEUES
MULTILINE_FLOW_ADDED = ("cluster: c1\nhosts: [\n  {name: a, slots: 1, mem: 1G},\n  {name: b, slots: 1, mem: 1G}, "
                        "{name: lab1, type: ssh, address: 127.0.0.1, port: 2201, slots: 2, mem: 1G, tags: [lab]}, "
                        "{name: lab2, type: ssh, address: 127.0.0.1, port: 2202, slots: 2, mem: 1G, tags: [lab]}\n]\n"
                        + QUEUES)

# The hosts list last in the file, indented at column 0, with no final newline.
LAST_NO_NEWLINE = "cluster: c1\n" + QUEUES + "hosts:\n- name: a\n  slots: 1\n  mem: 1G"
LAST_NO_NEWLINE_ADDED = (LAST_NO_NEWLINE + "\n- name: lab1  # xce lab\n  type: ssh\n  address: 127.0.0.1\n"
                         "  port: 2201\n  slots: 2\n  mem: 1G\n  tags: [lab]\n- name: lab2  # xce lab\n  type: ssh\n"
                         "  address: 127.0.0.1\n  port: 2202\n  slots: 2\n  mem: 1G\n  tags: [lab]\n")

CASES = {
    "block list, comments around it": (BLOCK, BLOCK_ADDED),
    "block list of flow mappings": (FLOW_ITEMS, FLOW_ITEMS_ADDED),
    "flow list on one line": (FLOW_LIST, FLOW_LIST_ADDED),
    "flow list over lines": (MULTILINE_FLOW, MULTILINE_FLOW_ADDED),
    "last in the file, no final newline": (LAST_NO_NEWLINE, LAST_NO_NEWLINE_ADDED),
}


@pytest.mark.parametrize("before, after", CASES.values(), ids=CASES.keys())
def test_adding_hosts_inserts_them_in_the_lists_own_layout(tmp_path, before, after):
    path = config_file(tmp_path, before)
    config_edit.add_hosts(path, [LAB1, LAB2], comment="xce lab")
    assert path.read_text() == after
    hosts = load_config(path).hosts
    assert [h.name for h in hosts[-2:]] == ["lab1", "lab2"] and hosts[-1].port == 2202


@pytest.mark.parametrize("before, after", CASES.values(), ids=CASES.keys())
def test_removing_the_added_hosts_gives_back_the_file_byte_for_byte(tmp_path, before, after):
    path = config_file(tmp_path, after)
    assert config_edit.remove_hosts(path, ["lab2", "lab1", "not-there"]) == ["lab1", "lab2"]
    # a file without a final newline keeps the one the first added line needed
    assert path.read_text() == (before if before.endswith("\n") else before + "\n")


def test_removing_a_host_from_the_middle_of_a_flow_list_takes_one_comma(tmp_path):
    path = config_file(tmp_path, "cluster: c1\nhosts: [{name: a, slots: 1, mem: 1G}, {name: b, slots: 1, mem: 1G}, "
                           "{name: c, slots: 1, mem: 1G}]\n" + QUEUES)
    config_edit.remove_hosts(path, ["b"])
    assert path.read_text().startswith("cluster: c1\nhosts: [{name: a, slots: 1, mem: 1G}, "
                                       "{name: c, slots: 1, mem: 1G}]\n")
    config_edit.remove_hosts(path, ["c"])
    assert path.read_text().startswith("cluster: c1\nhosts: [{name: a, slots: 1, mem: 1G}]\n")


def test_a_duplicate_name_is_refused_with_its_line_and_the_file_is_unchanged(tmp_path):
    path = config_file(tmp_path, BLOCK)
    with pytest.raises(ConfigError, match=r"already has a host named 'local' \(line 5\)"):
        config_edit.add_host(path, dict(LAB1, name="local"))
    with pytest.raises(ConfigError, match="'lab1'"):
        config_edit.add_hosts(path, [LAB1, dict(LAB2, name="lab1")])
    assert path.read_text() == BLOCK


BAD_EDITS = {
    "an invalid field": (lambda p: config_edit.add_host(p, dict(LAB1, port=99999)), "port"),
    "an unknown field": (lambda p: config_edit.add_host(p, dict(LAB1, colour="red")), "colour"),
    "ssh fields on a local host": (lambda p: config_edit.add_host(p, {"name": "x", "slots": 1, "mem": "1G",
                                                                      "port": 22}), "type: ssh"),
    "no host left": (lambda p: config_edit.remove_hosts(p, ["local"]), "hosts"),
}


@pytest.mark.parametrize("edit, named", BAD_EDITS.values(), ids=BAD_EDITS.keys())
def test_an_edit_that_would_not_load_leaves_the_file_byte_identical(tmp_path, edit, named):
    path = config_file(tmp_path, BLOCK)
    os.chmod(path, 0o640)
    stat = path.stat()
    with pytest.raises(ConfigError, match="is unchanged") as caught:
        edit(path)
    assert named in str(caught.value) and "(as edited)" in str(caught.value)
    assert path.read_bytes() == BLOCK.encode() and path.stat().st_ino == stat.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["xce.yaml"]  # no temp file left


def test_an_edit_keeps_the_files_mode(tmp_path):
    path = config_file(tmp_path, BLOCK)
    os.chmod(path, 0o640)
    config_edit.add_host(path, LAB1)
    assert path.stat().st_mode & 0o777 == 0o640


def test_files_that_cannot_be_edited_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="xce init"):
        config_edit.add_host(tmp_path / "xce.yaml", LAB1)
    path = config_file(tmp_path, "cluster: c1\nhosts: {a: 1}\n" + QUEUES)
    with pytest.raises(ConfigError, match="hosts .line 2.: Input should be a valid list"):
        config_edit.add_host(path, LAB1)
    path.write_text("cluster: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config_edit.add_host(path, LAB1)
    path.write_text("cluster: c1\n" + QUEUES)
    with pytest.raises(ConfigError, match="hosts .line 1.: Field required"):
        config_edit.remove_hosts(path, ["a"])


def test_anchors_and_aliases_stay_as_the_user_wrote_them(tmp_path):
    text = textwrap.dedent("""\
        cluster: c1
        hosts:
          - &a {name: a, slots: 1, mem: 1G, tags: &t [fast]}
          - {name: b, slots: 1, mem: 1G, tags: *t}
        queues: [{name: normal}]
        """)
    path = config_file(tmp_path, text)
    config_edit.add_host(path, LAB1)
    assert path.read_text().startswith(text.split("queues")[0])
    assert load_config(path).hosts[1].tags == ["fast"]


# ---- known_hosts ------------------------------------------------------------------------------------

KEY_A = "AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
KEY_B = "AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def test_known_hosts_lines_name_a_port_other_than_22_in_brackets():
    assert config_edit.known_hosts_line("127.0.0.11", 22, "ssh-ed25519", KEY_A) == f"127.0.0.11 ssh-ed25519 {KEY_A}"
    assert config_edit.known_hosts_line("127.0.0.1", 2201, "ssh-ed25519", KEY_A) == \
        f"[127.0.0.1]:2201 ssh-ed25519 {KEY_A}"


def test_known_hosts_lines_are_added_once_and_removed_exactly(tmp_path):
    path = tmp_path / "known_hosts"
    mine = f"gpu1.example.org ssh-ed25519 {KEY_B} the user's own"
    path.write_text("# kept\n" + mine + "\n")
    lab = [f"[127.0.0.1]:2201 ssh-ed25519 {KEY_A}", f"[127.0.0.1]:2202 ssh-ed25519 {KEY_A}"]
    assert config_edit.add_known_hosts(path, lab) == lab
    assert config_edit.add_known_hosts(path, [lab[0] + "  a comment", lab[1].replace(" ", "  ")]) == []
    assert path.read_text() == f"# kept\n{mine}\n{lab[0]}\n{lab[1]}\n"
    assert config_edit.remove_known_hosts(path, lab) == 2
    assert config_edit.remove_known_hosts(path, lab) == 0
    assert path.read_text() == f"# kept\n{mine}\n"


def test_a_changed_key_is_refused_unless_the_caller_replaces_a_stale_one(tmp_path):
    path = tmp_path / "known_hosts"
    old = f"host1,[127.0.0.1]:2201 ssh-ed25519 {KEY_A}"
    path.write_text(old + "\n")
    new = f"[127.0.0.1]:2201 ssh-ed25519 {KEY_B}"
    with pytest.raises(ConfigError, match="different ssh-ed25519 key .* reinstalled"):
        config_edit.add_known_hosts(path, [new])
    assert path.read_text() == old + "\n"
    assert config_edit.add_known_hosts(path, [new], replace=True) == [new]
    assert path.read_text() == new + "\n"


def test_a_new_known_hosts_file_is_private_and_a_bad_line_is_refused(tmp_path):
    path = tmp_path / "known_hosts"
    config_edit.add_known_hosts(path, [f"[127.0.0.1]:2201 ssh-ed25519 {KEY_A}"])
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match="HOSTS KEYTYPE KEY"):
        config_edit.add_known_hosts(path, ["127.0.0.1 ssh-ed25519"])
