"""The requests that only look (a part of the Agent, server.py): hello, ping, list, read. hello and ping
also give the host's lease clock, which the controller's lease grants count on (lease.py)."""

from __future__ import annotations

import os
import sys
import time

from .lease import clock
from .probe import gpus, user_name
from .runas import can_switch_user
from .util import VERSION
from .validate import Refused

TYPE_CHECKING = False  # true for mypy only: see shared.py
if TYPE_CHECKING:
    from .lease import HostLease
    from .shared import AgentState
    from .state import UnitState

READ_MAX = 1 << 20  # bytes a `read` may return at once


class Reads:
    """The hello, ping, list and read requests: units as `unit_state` judges them, the lease left
    from `host_lease`."""

    def __init__(self, state: AgentState, unit_state: UnitState, host_lease: HostLease):
        self.state, self.unit_state, self.host_lease = state, unit_state, host_lease

    def op_hello(self, req: dict) -> dict:
        s = self.state
        mem = 0
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
        switch = can_switch_user()
        return {
            "version": VERSION,
            "hostname": os.uname().nodename,
            "host_name": s.host_name,
            "cpus": len(os.sched_getaffinity(0)),
            "mem": mem,
            "pid": os.getpid(),
            "spool": s.spool,
            "mode": s.mode,
            "modes": s.host["modes"],
            "load": list(os.getloadavg()),
            "gpus": gpus(),
            "cgroup": s.host.get("cgroup"),
            "systemd": s.host.get("systemd"),
            "user": user_name(),
            "uid": os.getuid(),
            "boot_id": s.boot,
            "python": sys.version.split()[0],
            "clock": clock(),
            "lease": self.host_lease.lease_left(),
            # shared mode needs it: a launch spec's `user` runs the job as that user (runas.py)
            "can_switch_user": switch[0],
            "can_switch_user_why": switch[1],
        }

    def op_ping(self, req: dict) -> dict:
        return {"time": time.time(), "clock": clock()}

    def op_list(self, req: dict) -> dict:
        s = self.state
        self.unit_state.catch_up()
        units, known = [], self.unit_state.ask_systemd(list(s.units))
        for unit in sorted(s.units):
            status = self.unit_state.unit_status(unit, known)
            if status is None:  # cannot be: it is in s.units
                continue
            state, start_time, result, _pid = status
            if state == "running" and unit not in s.child_units:
                s.watched.add(unit)
            if result is not None:
                self.unit_state.reported(unit, result)
            units.append({"unit": unit, "status": state, "start_time": start_time, "result": result})
        if not s.queued:
            return {"units": units}
        # successors waiting behind a running unit (successors.py): not units yet, so apart
        return {"units": units, "queued": [{"unit": name, "after": spec.get("after")}
                                           for name, spec in sorted(s.queued.items())]}

    def op_read(self, req: dict) -> dict:
        """A piece of a file (for `xce peek`): up to `max` bytes from `offset`, base64."""
        import base64

        path, offset, size = req.get("path"), req.get("offset", 0), req.get("max", READ_MAX)
        if not isinstance(path, str) or not os.path.isabs(path):
            raise Refused(f"path must be an absolute path, not {path!r}")
        for key, value, top in (("offset", offset, None), ("max", size, READ_MAX)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (top and value > top):
                raise Refused(f"{key} must be an integer from 0{f' to {top}' if top else ''}, not {value!r}")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise Refused(f"cannot read {path}: {exc.strerror}") from None
        try:
            total = os.fstat(fd).st_size
            data = os.pread(fd, size, offset)
        except OSError as exc:
            raise Refused(f"cannot read {path}: {exc.strerror}") from None
        finally:
            os.close(fd)
        end = offset + len(data)
        return {"data_b64": base64.b64encode(data).decode("ascii"), "offset": end, "size": total, "eof": end >= total}
