"""The API server's limits: defaults, and the XCE_API_LIMITS override (`name=value,...`).

Standard library only. The defaults fit a lab's controller; the override is for tuning and for
tests that provoke a limit without waiting for the default.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, fields, replace
from typing import Any

from xce_lite import errors

LIMITS_ENV = "XCE_API_LIMITS"  # e.g. "workers=4,idle_timeout=2"


@dataclass(frozen=True)
class Limits:
    workers: int = 32  # threads running handlers; each long poll (`xce wait`) holds one
    long_polls: int = 24  # long polls held at their full length at once; more are answered as short polls
    max_connections: int = 512  # at most this many open (and a quarter of the fd limit)
    idle_timeout: float = 60.0  # a kept-alive connection without a request for this long is closed
    request_timeout: float = 10.0  # from a request's first byte to its last (slow senders get 408)
    send_timeout: float = 10.0  # a client that does not read its reply for this long is dropped
    queue_wait: float = 10.0  # a request waits this long for a free worker, then gets 503
    linger: float = 0.05  # a worker that answered waits this long for the connection's next request
    slice: float = 0.0001  # the API threads' CPU slice (cpuslice.py: the kernel's least); 0: its default
    max_body: int = 16 << 20
    max_head: int = 64 << 10

    @classmethod
    def from_env(cls, text: str | None) -> Limits:
        """The defaults, with `name=value,...` from XCE_API_LIMITS; a bad entry is an error."""
        limits = cls()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            limits = replace(limits, max_connections=max(16, min(limits.max_connections, soft // 4)))
        types = {f.name: f.type for f in fields(cls)}
        for part in filter(None, (text or "").split(",")):
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in types:
                raise errors.ConfigError(f"{LIMITS_ENV}: unknown limit {name!r}; the limits are {', '.join(types)}")
            try:
                number = int(value) if types[name] == "int" else float(value)
            except ValueError:
                raise errors.ConfigError(f"{LIMITS_ENV}: {name}={value!r} is not a number") from None
            if number < 0 or (number == 0 and name != "slice"):  # slice=0: the kernel's default slice
                raise errors.ConfigError(f"{LIMITS_ENV}: {name} must be above 0{' (or 0)' * (name == 'slice')}")
            changed: dict[str, Any] = {name: number}
            limits = replace(limits, **changed)
        return limits
