"""D-Bus on the service manager's own socket: just enough of it for the agent.

systemd answers on a private socket of its own (/run/systemd/private for the system manager, root
only; $XDG_RUNTIME_DIR/systemd/private for a user's): a peer-to-peer D-Bus connection, no bus daemon
between, so no Hello, no destination, no match rules. This is AUTH EXTERNAL, the marshalling of the
types the manager's methods take and return, method calls whose replies are matched by serial, and
signals skipped undecoded but UnitRemoved, JobRemoved and the PropertiesChanged of the units whose
object paths are in `Bus.watch` (units whose end the agent records itself: manager.py). Observed
(systemd 252): the manager sends every signal to every private connection, subscribed or not (about
30 messages, 21 KB, per transient unit's life); a unit's PropertiesChanged carry the values of its
ExecMain* properties and Result (Service interface), then ActiveState and SubState (Unit), and the
last of them goes out before its UnitRemoved.
"""

from __future__ import annotations

import errno
import os
import time

import _struct  # the C module under `struct`

from .util import unix_address


MANAGER_PATH, MANAGER = "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
DBUS_CALL, DBUS_RETURN, DBUS_ERROR, DBUS_SIGNAL = 1, 2, 3, 4
DBUS_TIMEOUT = 10.0  # seconds a blocking call waits for its reply
_DBUS_ALIGN = {"y": 1, "b": 4, "n": 2, "q": 2, "i": 4, "u": 4, "x": 8, "t": 8, "d": 8, "h": 4, "s": 4, "o": 4,
               "g": 1, "a": 4, "(": 8, "{": 8, "v": 1}
_DBUS_FIXED = {"y": "B", "b": "I", "n": "h", "q": "H", "i": "i", "u": "I", "x": "q", "t": "Q", "d": "d", "h": "I"}
_dbus_type_cache: dict[str, list[str]] = {}


class DBusError(Exception):
    """An error reply: `name` (org.freedesktop.systemd1.NoSuchUnit, ...) and the manager's message."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{message} ({name})")
        self.name = name


def dbus_types(signature: str) -> list[str]:
    """The complete types of a signature, in order: "sa(sv)" -> ["s", "a(sv)"]."""
    found = _dbus_type_cache.get(signature)
    if found is not None:
        return found
    found, i = [], 0
    while i < len(signature):
        j = i
        while signature[j] == "a":
            j += 1
        if signature[j] in "({":
            depth = 0
            while True:
                depth += (signature[j] in "({") - (signature[j] in ")}")
                j += 1
                if depth == 0:
                    break
        else:
            j += 1
        found.append(signature[i:j])
        i = j
    _dbus_type_cache[signature] = found
    return found


def dbus_put(buf: bytearray, kind: str, value) -> None:
    """Append `value` marshalled as the complete type `kind` (little-endian), aligned from the start
    of `buf`. Variants are (signature, value) pairs; dicts (a{..}) are dicts, structs tuples."""
    c = kind[0]
    buf += bytes(-len(buf) % _DBUS_ALIGN[c])
    if c in _DBUS_FIXED:
        buf += _struct.pack("<" + _DBUS_FIXED[c], value)
    elif c in "so":
        data = value.encode("utf-8")
        buf += _struct.pack("<I", len(data)) + data + b"\0"
    elif c == "g":
        data = value.encode("ascii")
        buf += bytes((len(data),)) + data + b"\0"
    elif c == "v":
        dbus_put(buf, "g", value[0])
        dbus_put(buf, value[0], value[1])
    elif c == "a":
        at = len(buf)
        buf += bytes(4)
        item = kind[1:]
        buf += bytes(-len(buf) % _DBUS_ALIGN[item[0]])
        start = len(buf)
        for v in value.items() if item[0] == "{" else value:
            dbus_put(buf, item, v)
        _struct.pack_into("<I", buf, at, len(buf) - start)
    elif c in "({":
        for field_kind, v in zip(dbus_types(kind[1:-1]), value):
            dbus_put(buf, field_kind, v)
    else:
        raise ValueError(f"cannot marshal D-Bus type {kind!r}")


def dbus_get(data: bytes, offset: int, kind: str, order: str):
    """(the value of complete type `kind` at `offset` in `data`, the offset past it); `order` is
    "<" or ">", the message's byte order."""
    c = kind[0]
    offset += -offset % _DBUS_ALIGN[c]
    if c in _DBUS_FIXED:
        fmt = order + _DBUS_FIXED[c]
        value = _struct.unpack_from(fmt, data, offset)[0]
        return (bool(value) if c == "b" else value), offset + _struct.calcsize(fmt)
    if c in "so":
        size = _struct.unpack_from(order + "I", data, offset)[0]
        return data[offset + 4 : offset + 4 + size].decode("utf-8", "replace"), offset + 5 + size
    if c == "g":
        size = data[offset]
        return data[offset + 1 : offset + 1 + size].decode("ascii", "replace"), offset + 2 + size
    if c == "v":
        signature, offset = dbus_get(data, offset, "g", order)
        value, offset = dbus_get(data, offset, signature, order)
        return (signature, value), offset
    if c == "a":
        size = _struct.unpack_from(order + "I", data, offset)[0]
        item = kind[1:]
        offset += 4
        offset += -offset % _DBUS_ALIGN[item[0]]
        end, items = offset + size, []
        while offset < end:
            value, offset = dbus_get(data, offset, item, order)
            items.append(value)
        return (dict(items) if item[0] == "{" else items), offset
    if c in "({":
        values = []
        for field_kind in dbus_types(kind[1:-1]):
            value, offset = dbus_get(data, offset, field_kind, order)
            values.append(value)
        return tuple(values), offset
    raise ValueError(f"cannot read D-Bus type {kind!r}")


class DBusMessage:
    """A received message: a reply (`reply_to` its call's serial, `error` the error name of an error
    reply) or a signal (`member`); `body` decoded for replies, UnitRemoved and JobRemoved. A watched
    unit's PropertiesChanged has its `path` and `interface` (the one whose properties changed), and
    its body undecoded in `raw` (most are read no further: decoded() when needed)."""

    __slots__ = ("body", "error", "interface", "kind", "member", "path", "raw", "reply_to")

    def __init__(self, kind: int, reply_to: int | None, member: str | None, error: str | None, body: list):
        self.kind, self.reply_to, self.member, self.error, self.body = kind, reply_to, member, error, body
        self.path: str | None = None
        self.interface: str | None = None
        self.raw: tuple | None = None  # (message bytes, body offset, byte order, signature)

    def prop(self, name: str):
        """The value of property `name` in a raw PropertiesChanged (None if it is not there), found
        without decoding the rest: its key, then the variant after it."""
        if self.raw is None:
            changed = self.body[1] if len(self.body) > 1 else {}
            return changed[name][1] if name in changed else None
        message, offset, order, _signature = self.raw
        key = name.encode() + b"\0"
        at = message.find(key, offset)
        while at >= 4 and _struct.unpack_from(order + "I", message, at - 4)[0] != len(key) - 1:
            at = message.find(key, at + 1)  # the name inside some value: not a key
        if at < 4:
            return None
        return dbus_get(message, at + len(key), "v", order)[0][1]

    def decoded(self) -> list:
        """The body, decoded now if it was left raw."""
        if self.raw is not None:
            message, offset, order, signature = self.raw
            self.raw, self.body = None, []
            for body_kind in dbus_types(signature):
                value, offset = dbus_get(message, offset, body_kind, order)
                self.body.append(value)
        return self.body


def unit_path(unit: str) -> str:
    """The manager's object path of unit `unit` ("x-1.service" -> .../unit/x_2d1_2eservice)."""
    escaped = "".join(c if c.isascii() and (c.isalpha() or (c.isdigit() and i)) else f"_{ord(c):02x}"
                      for i, c in enumerate(unit))
    return f"{MANAGER_PATH}/unit/{escaped}"


class Bus:
    """A connection to a systemd manager's private socket. Non-blocking once connected: send()
    queues a call and returns its serial, write() sends what the socket takes, read() returns the
    messages received whole; call() waits (up to a deadline) for one reply, keeping what else came
    in `backlog` for the owner's loop. OSError once the connection is gone: make a new Bus."""

    def __init__(self, path: str, timeout: float = 5.0):
        import _socket

        self.path = path
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            address, fd = unix_address(path)
            try:
                self.sock.connect(address)
            finally:
                if fd >= 0:
                    os.close(fd)
            # BEGIN goes with AUTH, so that the manager has read it when its OK comes. Observed
            # (systemd 252): a call that reaches it in one read with a late BEGIN may go unread
            # until more data comes.
            uid = str(os.getuid()).encode().hex().encode()
            self.sock.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\nBEGIN\r\n")
            line = b""
            while not line.endswith(b"\r\n") and len(line) < 512:
                data = self.sock.recv(512)
                if not data:
                    break
                line += data
            if not line.startswith(b"OK "):
                raise OSError(errno.EACCES, f"the manager refused AUTH EXTERNAL: {line.strip()!r}", path)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.serial = 0
        self.out = bytearray()
        self.inbuf = bytearray()
        self.backlog: list[DBusMessage] = []
        self.watch: set[str] = set()  # object paths of units whose PropertiesChanged are wanted

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def send(self, member: str, signature: str = "", args: tuple = (), path: str = MANAGER_PATH,
             interface: str = MANAGER) -> int:
        """Queue a method call; its serial. write() sends it."""
        self.serial += 1
        body = bytearray()
        for kind, value in zip(dbus_types(signature), args):
            dbus_put(body, kind, value)
        fields = [(1, ("o", path)), (2, ("s", interface)), (3, ("s", member))]
        if signature:
            fields.append((8, ("g", signature)))
        head = bytearray(_struct.pack("<cBBBII", b"l", DBUS_CALL, 0, 1, len(body), self.serial))
        dbus_put(head, "a(yv)", fields)
        head += bytes(-len(head) % 8)
        self.out += head + body
        return self.serial

    def write(self) -> None:
        """Send as much of the queued calls as the socket takes now."""
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return
            del self.out[:sent]

    def read(self) -> list[DBusMessage]:
        """The messages that have arrived whole (none if nothing came); OSError if the manager
        closed the connection (it does so when it re-executes itself)."""
        while True:
            try:
                data = self.sock.recv(1 << 18)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                raise OSError(errno.ECONNRESET, "the manager closed the connection", self.path)
            self.inbuf += data
        return self.parse()

    def parse(self) -> list[DBusMessage]:
        found, buf, at = [], self.inbuf, 0
        while len(buf) - at >= 16:
            order = "<" if buf[at] == 0x6C else ">"  # 'l'
            size, _serial, fields_size = _struct.unpack_from(order + "III", buf, at + 4)
            head_end = at + 16 + fields_size + (-(16 + fields_size) % 8)
            end = head_end + size
            if len(buf) < end:
                break
            kind = buf[at + 1]
            head = buf[at + 16 : head_end]
            if kind == DBUS_SIGNAL and self.watch and b"PropertiesChanged" in head:
                # sd-bus puts the path first: field 1, "o", its length at 20; else the fields are read
                if head[:4] == b"\x01\x01o\x00":
                    n = _struct.unpack_from(order + "I", buf, at + 20)[0]
                    path = buf[at + 24 : at + 24 + n].decode("utf-8", "replace")
                else:
                    path = dict(dbus_get(bytes(buf[at:end]), 12, "a(yv)", order)[0]).get(1, (None, None))[1]
                if path in self.watch:  # one of ours: its body is read as far as the caller needs
                    message = bytes(buf[at:end])
                    found.append(DBusMessage(kind, None, "PropertiesChanged", None, []))
                    # the interface whose properties changed: the body's first string
                    found[-1].path, found[-1].interface = path, dbus_get(message, head_end - at, "s", order)[0]
                    found[-1].raw = (message, head_end - at, order, "sa{sv}as")
            elif kind != DBUS_SIGNAL or b"UnitRemoved" in head or b"JobRemoved" in head:  # the rest: skipped
                message = bytes(buf[at:end])
                fields = dict(dbus_get(message, 12, "a(yv)", order)[0])
                body, offset = [], head_end - at
                for body_kind in dbus_types(fields.get(8, ("g", ""))[1]):
                    value, offset = dbus_get(message, offset, body_kind, order)
                    body.append(value)
                reply_to, member, error = (fields.get(n, (None, None))[1] for n in (5, 3, 4))
                found.append(DBusMessage(kind, reply_to, member, error, body))
            at = end
        del buf[:at]
        return found

    def call(self, member: str, signature: str = "", args: tuple = (), timeout: float = DBUS_TIMEOUT,
             **where: str) -> list:
        """Call and wait for the reply: its body; DBusError for an error reply, OSError (TimeoutError
        after `timeout` seconds) if the connection fails. Other messages go to `backlog`."""
        import select

        serial = self.send(member, signature, args, **where)
        deadline = time.monotonic() + timeout
        poller = select.poll()
        while True:
            self.write()
            for message in self.read():
                if message.reply_to == serial and message.kind in (DBUS_RETURN, DBUS_ERROR):
                    if message.kind == DBUS_ERROR:
                        text = str(message.body[0]) if message.body else ""
                        raise DBusError(message.error or "(no error name)", text)
                    return message.body
                self.backlog.append(message)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(errno.ETIMEDOUT, f"no reply to {member} within {timeout:g} s", self.path)
            poller.register(self.sock.fileno(), select.POLLIN | (select.POLLOUT if self.out else 0))
            poller.poll(left * 1000)


def manager_socket(mode: str, env: dict) -> str:
    """The private socket of the manager that runs units in `mode` ("systemd" or "user")."""
    if mode == "user":
        return os.path.join(env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}", "systemd", "private")
    return "/run/systemd/private"
