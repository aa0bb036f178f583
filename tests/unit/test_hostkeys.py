"""hostkeys.py: known_hosts read and written as OpenSSH does, checked against OpenSSH's own ssh-keygen."""

from __future__ import annotations

import base64
import stat
import subprocess
from pathlib import Path

import pytest

from xce_lite.errors import ConfigError, HostKeyChanged, HostKeyUnknown
from xce_lite.exec.hostkeys import KnownHosts, fingerprint, host_field_matches, key_name


class Key:
    """A real key pair made by ssh-keygen: its type, blob and public line."""

    def __init__(self, path: Path, kind: str = "ed25519") -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "", "-f", str(path)], check=True,
                       stdin=subprocess.DEVNULL)
        self.pub = path.with_suffix(".pub")
        self.type, b64 = self.pub.read_text().split()[:2]
        self.b64, self.blob = b64, base64.b64decode(b64)

    def line(self, hosts: str) -> str:
        return f"{hosts} {self.type} {self.b64}\n"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    made = tmp_path_factory.mktemp("keys")
    return {name: Key(made / name, kind) for name, kind in
            (("a", "ed25519"), ("b", "ed25519"), ("r", "rsa"))}


def test_fingerprint_is_what_ssh_keygen_prints(keys):
    for key in keys.values():
        printed = subprocess.run(["ssh-keygen", "-l", "-f", str(key.pub)], capture_output=True, text=True,
                                 check=True).stdout.split()[1]
        assert fingerprint(key.blob) == printed


@pytest.mark.parametrize(("field", "name", "matches"), [
    ("host1,127.0.0.11", "127.0.0.11", True),
    ("host1,127.0.0.11", "HOST1", True),
    ("host1,127.0.0.11", "127.0.0.1", False),
    ("127.0.0.*", "127.0.0.42", True),
    ("127.0.0.?", "127.0.0.42", False),
    ("127.0.0.*,!127.0.0.13", "127.0.0.13", False),
    ("!127.0.0.13,127.0.0.*", "127.0.0.14", True),
    ("[127.0.0.11]:2222", "[127.0.0.11]:2222", True),
    ("127.0.0.11", "[127.0.0.11]:2222", False),
    ("[127.0.0.11]:2222", "127.0.0.11", False),
    ("|1|garbage", "127.0.0.11", False),
])
def test_host_field_patterns(field, name, matches):
    assert host_field_matches(field, name) is matches


def test_key_name_is_the_address_on_port_22_and_bracketed_elsewhere():
    assert key_name("127.0.0.11", 22) == "127.0.0.11"
    assert key_name("127.0.0.11", 2222) == "[127.0.0.11]:2222"


def test_hashed_entries_from_ssh_keygen_are_found(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text(keys["a"].line("127.0.0.11") + keys["b"].line("[127.0.0.11]:2222"))
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|") and "127.0.0.11" not in known.read_text()
    kh = KnownHosts([str(known)])
    kh.check("h", "127.0.0.11", keys["a"].type, keys["a"].blob)
    kh.check("h", "[127.0.0.11]:2222", keys["b"].type, keys["b"].blob)
    with pytest.raises(HostKeyChanged):
        kh.check("h", "[127.0.0.11]:2222", keys["a"].type, keys["a"].blob)


def test_unknown_key_is_refused_with_its_fingerprint_and_the_fix(tmp_path, keys):
    kh = KnownHosts([str(tmp_path / "missing")], str(tmp_path / "accepted"))
    with pytest.raises(HostKeyUnknown) as caught:
        kh.check("host1", "127.0.0.11", keys["a"].type, keys["a"].blob)
    assert caught.value.fingerprint == fingerprint(keys["a"].blob)
    assert fingerprint(keys["a"].blob) in str(caught.value)
    assert "`xce hosts add host1 --accept-new`" in str(caught.value) and caught.value.exit_code == 2
    assert not (tmp_path / "accepted").exists()


def test_accept_new_appends_what_openssh_reads_then_trusts_it(tmp_path, keys):
    accepted = tmp_path / "home" / "known_hosts"
    kh = KnownHosts([], str(accepted))
    kh.check("host1", "127.0.0.11", keys["a"].type, keys["a"].blob, accept_new=True)
    kh.check("host1", "[127.0.0.11]:2222", keys["b"].type, keys["b"].blob, accept_new=True)
    assert accepted.read_text() == keys["a"].line("127.0.0.11") + keys["b"].line("[127.0.0.11]:2222")
    assert stat.S_IMODE(accepted.stat().st_mode) == 0o600 and stat.S_IMODE(accepted.parent.stat().st_mode) == 0o700
    for name, key in (("127.0.0.11", "a"), ("[127.0.0.11]:2222", "b")):
        found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(accepted)], capture_output=True, text=True)
        assert found.returncode == 0 and keys[key].b64 in found.stdout
    again = KnownHosts([], str(accepted))  # a new reader: no flag needed any more
    again.check("host1", "127.0.0.11", keys["a"].type, keys["a"].blob)


def test_accept_after_a_last_line_without_newline(tmp_path, keys):
    accepted = tmp_path / "known_hosts"
    accepted.write_text(keys["b"].line("other").rstrip("\n"))
    key = KnownHosts([], str(accepted)).accept("127.0.0.11", keys["a"].type, keys["a"].blob)
    assert accepted.read_text() == keys["b"].line("other") + keys["a"].line("127.0.0.11")
    assert (key.path, key.line) == (str(accepted), 2)


def test_changed_key_is_refused_even_with_accept_new_naming_file_and_line(tmp_path, keys):
    known, accepted = tmp_path / "known_hosts", tmp_path / "accepted"
    known.write_text("# a comment\n" + keys["r"].line("elsewhere") + keys["a"].line("host1,127.0.0.11"))
    kh = KnownHosts([str(known)], str(accepted))
    with pytest.raises(HostKeyChanged) as caught:
        kh.check("host1", "127.0.0.11", keys["b"].type, keys["b"].blob, accept_new=True)
    assert (caught.value.path, caught.value.line) == (str(known), 3)
    assert f"{known} line 3" in str(caught.value) and fingerprint(keys["b"].blob) in str(caught.value)
    assert not accepted.exists()


def test_a_key_of_another_type_than_the_listed_ones_counts_as_changed(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text(keys["r"].line("127.0.0.11"))
    kh = KnownHosts([str(known)], str(tmp_path / "accepted"))
    with pytest.raises(HostKeyChanged, match="line 1"):
        kh.check("host1", "127.0.0.11", keys["a"].type, keys["a"].blob, accept_new=True)
    restricted = kh.restricted_algorithms("127.0.0.11")
    assert "ssh-ed25519" in restricted and "rsa-sha2-512" not in restricted
    assert kh.restricted_algorithms("127.0.0.99") == []


def test_a_revoked_key_is_refused_whatever_else_lists_it(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text(keys["a"].line("127.0.0.11") + "@revoked " + keys["a"].line("*"))
    with pytest.raises(HostKeyChanged, match="REVOKES"):
        KnownHosts([str(known)]).check("host1", "127.0.0.11", keys["a"].type, keys["a"].blob, accept_new=True)


def test_unreadable_lines_and_cert_authorities_are_skipped(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text("garbage\n127.0.0.11 ssh-ed25519 !!notbase64!!\n@cert-authority * "
                     f"{keys['b'].type} {keys['b'].b64}\n" + keys["a"].line("127.0.0.11"))
    kh = KnownHosts([str(known)])
    assert [(k.line, k.blob) for k in kh.keys] == [(4, keys["a"].blob)]


def test_an_unreadable_file_is_a_config_error(tmp_path):
    (tmp_path / "known_hosts").mkdir()  # unreadable as a file, even for root
    with pytest.raises(ConfigError, match="cannot read known_hosts file .*known_hosts"):
        KnownHosts([str(tmp_path / "known_hosts")])
