"""Host keys for the SSH transport: OpenSSH known_hosts files, read and appended as OpenSSH does.

fabric 3 accepts any host key (paramiko's AutoAddPolicy, no known_hosts loaded). The SSH transport
instead gives each connection a `KnownHostsPolicy`, and loads no key into paramiko, so that every
key a server shows is judged here, by one rule:

- a key listed for the host (a line whose host field matches its name) is trusted;
- a key listed `@revoked` is refused, always;
- a host with lines in the files, none of them this key, has CHANGED its key: refused always, even
  with accept_new, naming the file and line that holds the old key. This includes a key of another
  type than the ones listed (stricter than OpenSSH, which would ask): the connection offers the
  server only the listed types (`restricted_algorithms`), so a server that still has its old key
  shows it, and one that shows another type has lost or replaced it;
- a host with no line at all is UNKNOWN: refused with the key's SHA256 fingerprint as OpenSSH prints
  it and the command that accepts it, or, with accept_new, appended to the accepted-keys file.

The name a key is listed under is the address for port 22 and `[address]:port` otherwise, as
OpenSSH writes it. Host fields may be hashed (`|1|salt|hash`), lists of patterns with `*`, `?` and
negation (`!`), compared without case. `@cert-authority` lines are skipped (host certificates are
not supported); unreadable lines are skipped, as OpenSSH does.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

import paramiko

from xce_lite.errors import ConfigError, HostKeyChanged, HostKeyUnknown

# Host key algorithms a server may use for each key type a known_hosts line names.
_ALGORITHMS = {
    "ssh-ed25519": ("ssh-ed25519", "ssh-ed25519-cert-v01@openssh.com"),
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa", "rsa-sha2-512-cert-v01@openssh.com",
                "rsa-sha2-256-cert-v01@openssh.com", "ssh-rsa-cert-v01@openssh.com"),
    "ssh-dss": ("ssh-dss", "ssh-dss-cert-v01@openssh.com"),
    **{f"ecdsa-sha2-nistp{n}": (f"ecdsa-sha2-nistp{n}", f"ecdsa-sha2-nistp{n}-cert-v01@openssh.com")
       for n in (256, 384, 521)},
    "sk-ssh-ed25519@openssh.com": ("sk-ssh-ed25519@openssh.com",),
    "sk-ecdsa-sha2-nistp256@openssh.com": ("sk-ecdsa-sha2-nistp256@openssh.com",),
}
_ALL_ALGORITHMS = tuple(a for algorithms in _ALGORITHMS.values() for a in algorithms)


def key_name(address: str, port: int) -> str:
    """The name OpenSSH lists a host's key under: `address`, or `[address]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(blob: bytes) -> str:
    """A key's fingerprint as `ssh-keygen -l` and ssh print it: SHA256:<base64, unpadded>."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class KnownKey:
    """One key line of a known_hosts file."""

    path: str
    line: int  # 1-based, as editors and `ssh-keygen -R` messages count
    hosts: str  # the host field: patterns, or one hashed name
    key_type: str
    blob: bytes
    revoked: bool = False

    def matches(self, name: str) -> bool:
        return host_field_matches(self.hosts, name)

    @property
    def where(self) -> str:
        return f"{self.path} line {self.line}"


def host_field_matches(field: str, name: str) -> bool:
    """Whether a known_hosts host field names `name` (OpenSSH's rules: see the module docstring)."""
    name = name.lower()
    if field.startswith("|1|"):
        try:
            salt_b64, hash_b64 = field[3:].split("|", 1)
            salt, want = base64.b64decode(salt_b64), base64.b64decode(hash_b64)
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)
    matched = False
    for pattern in field.lower().split(","):
        negated = pattern.startswith("!")
        if _glob(pattern[1:] if negated else pattern, name):
            if negated:
                return False
            matched = True
    return matched


def _glob(pattern: str, name: str) -> bool:
    """OpenSSH's wildcards: `*` and `?` only (`[` is a plain character: think `[host]:port`)."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, re.DOTALL) is not None


def read_known_hosts(path: str) -> list[KnownKey]:
    """The key lines of one known_hosts file; a missing file has none. Raises ConfigError if the file
    exists but cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"cannot read known_hosts file {path}: {exc.strerror}; fix its permissions or "
                          "remove it from ssh.known_hosts") from exc
    keys = []
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if marker not in (None, "@revoked") or len(fields) < 3:
            continue  # @cert-authority (unsupported), or not a key line
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except binascii.Error:
            continue
        keys.append(KnownKey(path, number, fields[0], fields[1], blob, revoked=marker == "@revoked"))
    return keys


class KnownHosts:
    """The keys trusted by the listed known_hosts files and the accepted-keys file (which `accept`
    appends to). Files are read once, when made; `~` is expanded."""

    def __init__(self, files: Iterable[str], accepted: str | None = None) -> None:
        self.accepted = os.path.expanduser(accepted) if accepted else None
        self.files = list(dict.fromkeys(os.path.expanduser(f) for f in [*files, *([accepted] if accepted else [])]))
        self.keys = [k for path in self.files for k in read_known_hosts(path)]

    def keys_for(self, name: str) -> list[KnownKey]:
        return [k for k in self.keys if k.matches(name)]

    def restricted_algorithms(self, name: str) -> list[str]:
        """The host key algorithms to disable for `name` so that its server shows a key of a type the
        files list for it; none for an unknown host (it may show any)."""
        types = {k.key_type for k in self.keys_for(name) if not k.revoked}
        allowed = {a for t in types for a in _ALGORITHMS.get(t, (t,))}
        return [a for a in _ALL_ALGORITHMS if a not in allowed] if allowed else []

    def check(self, label: str, name: str, key_type: str, blob: bytes, accept_new: bool = False,
              accept_as: str | None = None) -> None:
        """Trust the key, accept it (accept_new, unknown host only), or raise HostKeyUnknown or
        HostKeyChanged. `label` is the host as the user knows it, `accept_as` the cluster host whose
        `xce hosts add NAME --accept-new` accepts it (default: `label`), for the messages."""
        accept_as = accept_as or label
        known = self.keys_for(name)
        shown = f"{key_type} {fingerprint(blob)}"
        revoked = [k for k in known if k.revoked and k.blob == blob]
        if revoked:
            raise HostKeyChanged(
                f"host {label} ({name}) shows the key {shown}, which {revoked[0].where} REVOKES; "
                "do not use this host until its administrator gives it a new key",
                fingerprint=fingerprint(blob), path=revoked[0].path, line=revoked[0].line)
        valid = [k for k in known if not k.revoked]
        if any(k.key_type == key_type and k.blob == blob for k in valid):
            return
        if valid:
            old = next((k for k in valid if k.key_type == key_type), valid[0])
            raise HostKeyChanged(
                f"HOST KEY CHANGED for {label} ({name}): it shows {shown}, but {old.where} holds "
                f"another {old.key_type} key for it ({fingerprint(old.blob)}). Someone may be "
                "intercepting the connection, or the host was reinstalled. If you know why it changed, "
                f"remove that line (`ssh-keygen -R '{name}' -f {old.path}`), check the new fingerprint "
                f"on the host (`ssh-keygen -lf` on its host key), then `xce hosts add {accept_as} --accept-new`",
                fingerprint=fingerprint(blob), path=old.path, line=old.line)
        if not accept_new or self.accepted is None:
            where = ", ".join(self.files) or "no known_hosts file"
            raise HostKeyUnknown(
                f"the host key of {label} ({name}) is not known: {shown} is in none of {where}. "
                f"If that fingerprint is the host's, accept it with `xce hosts add {accept_as} --accept-new`",
                fingerprint=fingerprint(blob))
        self.accept(name, key_type, blob)

    def accept(self, name: str, key_type: str, blob: bytes) -> KnownKey:
        """Append `name key_type base64` to the accepted-keys file (made 0600, its directory 0700),
        durably, as one write under an exclusive lock, and trust it from now on."""
        path = self.accepted
        if path is None:
            raise ValueError("no accepted-keys file was given")
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        line = f"{name} {key_type} {base64.b64encode(blob).decode()}\n".encode()
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                existing = os.pread(fd, os.fstat(fd).st_size, 0)
                if existing and not existing.endswith(b"\n"):  # a last line without its newline
                    line = b"\n" + line
                os.write(fd, line)
                os.fsync(fd)
                number = existing.count(b"\n") + line.count(b"\n")
            finally:
                os.close(fd)
        except OSError as exc:
            raise ConfigError(f"cannot write the accepted host key to {path}: {exc.strerror}; check that "
                              "file and its directory") from exc
        key = KnownKey(path, number, name, key_type, blob)
        self.keys.append(key)
        return key


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """paramiko's hook for a key it has no record of, which is every key: the client it guards holds
    none, so that `KnownHosts.check` judges them all. Raises HostKeyUnknown or HostKeyChanged."""

    def __init__(self, known: KnownHosts, label: str, accept_as: str, accept_new: bool) -> None:
        self.known, self.label, self.accept_as, self.accept_new = known, label, accept_as, accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.known.check(self.label, hostname, key.get_name(), key.asbytes(), self.accept_new, self.accept_as)


def no_listed_type_error(known: KnownHosts, label: str, accept_as: str, name: str) -> HostKeyChanged:
    """The error for a server that offered none of the key types listed for it (see the module
    docstring): it has lost or replaced the key the files hold."""
    old = next(k for k in known.keys_for(name) if not k.revoked)
    return HostKeyChanged(
        f"HOST KEY CHANGED for {label} ({name}): it no longer offers a {old.key_type} key, which "
        f"{old.where} holds for it ({fingerprint(old.blob)}). Someone may be intercepting the "
        "connection, or the host was reinstalled. If you know why, remove that line "
        f"(`ssh-keygen -R '{name}' -f {old.path}`), then `xce hosts add {accept_as} --accept-new`",
        fingerprint=None, path=old.path, line=old.line)
