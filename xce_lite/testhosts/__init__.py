"""Test hosts: a small cluster of real hosts on one Linux machine, as root (or, without, plain sshd hosts).

Each host is a real systemd, PID 1 of its own PID, mount, UTS, IPC and cgroup namespaces, with a
real sshd listening on its own loopback address (127.0.0.11, .12, ... port 22). The file system is
shared, as on a lab with NFS homes, except /tmp, /var/tmp, /run and /dev/shm, which are private to
each host. A plain host (`plain=True`) boots no systemd: its PID 1 is `sleep infinity`, for the
engine's fallback without systemd.

    python -m xce_lite.testhosts up 3 [DIR] [--plain] [--unprivileged] [--first-ip 127.0.0.21]
    ssh -F DIR/ssh_config host1 hostname
    python -m xce_lite.testhosts status [DIR]
    python -m xce_lite.testhosts down [DIR]

Without root (or with `unprivileged=True`, `--unprivileged`, so that root can try it), a host is
only an sshd run by the caller on 127.0.0.1 and a free high port, with a host key of its own,
logging the caller in with the directory's key (AuthorizedKeysFile there, UsePAM no). It is a
plain host with NO isolation: the machine's /tmp, process table and hostname, no systemd, and
`down` stops its sshd and the sessions under it, not what those started detached from them.

From Python: `up(n, dir)` returns the hosts, `down(dir)` stops every host started in `dir`,
`status(dir)` tells which are up. `dir` must lie outside /tmp (the hosts have their own /tmp, so they
would not see it). `up` writes there: id_ed25519 (the client key), known_hosts, ssh_config (Host hostN,
User root, StrictHostKeyChecking yes), and hosts.json (what `down` and `status` read).

What keeps the machine safe (learned on Debian 12, systemd 252, cgroup v1 hybrid):
- systemd in a namespace runs systemd-tmpfiles at boot, which would WIPE THE SHARED /tmp: every host
  has a private tmpfs /tmp and /var/tmp, and the tmpfiles units are masked (/dev/null bind-mounted over
  the unit file, inside the host's mount namespace only). So are the other units that would change the
  machine rather than the host: sysctl, kernel modules, binfmt, remounting /, sysusers, the journal
  flush to /var/log/journal, the daily timers (apt, dpkg backup, e2scrub, man-db), ssh.service.
- each systemd host gets cgroups of its own (a child of the caller's, made the root of its cgroup
  namespace and mounted as its /sys/fs/cgroup); without them every host's systemd would manage the
  same machine-wide system.slice and init.scope.
- loopback addresses are claimed machine-wide in /run/xce-testhosts (and port 22 is test-bound), so
  parallel harnesses never share one. Test traffic only ever goes to 127.0.0.0/8.
- `down` stops only the hosts recorded in `dir`, by PID (checked against the process start time):
  `systemctl exit` inside the host, then SIGKILL of the namespace's PID 1, which takes all in it.
"""

from __future__ import annotations

# The harness is split by concern (base: values and checks; claims: loopback addresses; cgroups;
# boot: namespaced hosts; unprivileged: sshd-only hosts; records: hosts.json, status, down;
# cluster: up; users: users inside a host); this package is its one public face.
from xce_lite.testhosts.base import (
    DEFAULT_DIR,
    SSH_PORT,
    STATE,
    HostStatus,
    TestHost,
    TestHostError,
    _alive,
    _check_dir,
    _comm,
    _start_time,
    missing_prerequisites,
    namespace_pids,
)
from xce_lite.testhosts.boot import _sshd_argv
from xce_lite.testhosts.claims import _claims_dir, claim_ips, release_ips
from xce_lite.testhosts.cluster import up
from xce_lite.testhosts.records import down, hosts, status
from xce_lite.testhosts.users import (
    PACKAGE_ROOT,
    HostUser,
    LocalUser,
    add_lingering_user,
    add_local_users,
    remove_local_users,
)

__all__ = [
    "DEFAULT_DIR", "PACKAGE_ROOT", "SSH_PORT", "STATE", "HostStatus", "HostUser", "LocalUser", "TestHost",
    "TestHostError",
    "_alive", "_check_dir", "_claims_dir", "_comm", "_sshd_argv", "_start_time", "add_lingering_user",
    "add_local_users", "claim_ips", "down", "hosts", "missing_prerequisites", "namespace_pids", "release_ips",
    "remove_local_users", "status", "up",
]
