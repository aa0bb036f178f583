"""Who calls the API: the kernel's word on a Unix socket connection, never the request's.

`Callers.of(sock)` reads SO_PEERCRED (uid, gid, pid) and adds the user's name and supplementary
groups from the passwd and group databases, kept `USER_CACHE` seconds per uid (a user added to a
group is seen within a minute; at most 4096 uids are kept). Handlers get a frozen `Caller`.
"""

from __future__ import annotations

import os
import pwd
import socket
import struct
import time
from dataclasses import dataclass

USER_CACHE = 60.0  # seconds a uid's name and groups are kept


@dataclass(frozen=True)
class Caller:
    """Who calls, as the kernel said (SO_PEERCRED: uid, gid, pid) and the passwd and group
    databases add (the name, the supplementary groups of that name)."""

    uid: int
    pid: int
    user: str
    gid: int = -1  # the caller's effective group (projects: group membership and defaults)
    groups: tuple[int, ...] = ()  # supplementary gids, from the group database (initgroups' list)
    # Set per request by the controller's route table (permissions.py, from the configuration in
    # use); None: root or the controller's own user, as in personal mode.
    admin: bool | None = None

    @property
    def is_admin(self) -> bool:
        if self.admin is not None:
            return self.admin
        return self.uid == 0 or self.uid == os.getuid()


class Callers:
    """The Caller of each connection; only the API's serving thread uses it (no lock)."""

    def __init__(self) -> None:
        self._users: dict[int, tuple[str, tuple[int, ...], float]] = {}  # uid -> name, gids, when read

    def of(self, sock: socket.socket) -> Caller:
        """The peer of `sock`; OSError if the kernel cannot say (the connection is gone)."""
        pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            struct.calcsize("3i")))
        now = time.monotonic()
        known = self._users.get(uid)
        if known is None or now - known[2] > USER_CACHE:  # a user added to a group is seen within a minute
            try:
                entry = pwd.getpwuid(uid)
                user, groups = entry.pw_name, tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
            except KeyError:
                user, groups = str(uid), ()
            known = (user, groups, now)
            if len(self._users) >= 4096:
                self._users.clear()
            self._users[uid] = known
        return Caller(uid=uid, pid=pid, user=known[0], gid=gid, groups=known[1])
