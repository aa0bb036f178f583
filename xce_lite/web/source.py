"""Where the dashboard's data comes from: the controller's API on the home's Unix socket, as the
user who runs `xce web` (the socket's peer credentials decide what that user may see, so the
dashboard can never show more than `xce jobs -u all` shows them). It never opens the store.

One Client per server thread (a Client is one keep-alive connection, not shared between threads).
`cached` keeps a reply for a few seconds, so that many browsers polling at once cost the controller
one request per route and period, not one each.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from xce_lite.api.client import Client


class Source:
    def __init__(self, socket_path: Path, timeout: float = 20.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self._local = threading.local()
        self._cache: dict[tuple, tuple[float, Any]] = {}
        self._cache_lock = threading.Lock()

    def _client(self) -> Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client(self.socket_path, timeout=self.timeout)
        return client

    def get(self, path: str, **query: Any) -> Any:
        """The reply of GET /xce/v1/<path>; XceError kinds as the CLI gets them (ControllerDown, ...)."""
        return self._client().get(path, **query)

    def cached(self, seconds: float, path: str, **query: Any) -> Any:
        key = (path, tuple(sorted(query.items())))
        now = time.monotonic()
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < seconds:
                return hit[1]
        reply = self.get(path, **query)
        with self._cache_lock:
            self._cache[key] = (now, reply)
            if len(self._cache) > 256:  # filters make many keys: forget the oldest
                for old in sorted(self._cache, key=lambda k: self._cache[k][0])[:128]:
                    del self._cache[old]
        return reply
