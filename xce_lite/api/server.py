"""The controller's REST JSON API under /xce/v1/ on a Unix socket.

Who calls is taken from the kernel (SO_PEERCRED on the connection), never from the request: a
client cannot claim to be someone else. Handlers are the controller's methods; this module only maps
routes to them, decodes JSON, and turns XceError into an HTTP status with `{"error", "kind"}`.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import socketserver
import struct
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from xce_lite import errors

PREFIX = "/xce/v1"
_STATUS = {errors.SpecError: 400, errors.ConfigError: 400, errors.HomeError: 400,
           errors.NotFound: 404, errors.TransitionError: 409}


@dataclass(frozen=True)
class Caller:
    uid: int
    pid: int
    user: str
    gid: int = -1  # the caller's effective group (projects: group membership and defaults)

    @property
    def is_admin(self) -> bool:
        return self.uid == 0 or self.uid == os.getuid()


# (method, path) -> handler(caller, query, body) -> JSON-able reply
Routes = dict[tuple[str, str], Callable[[Caller, dict[str, str], Any], Any]]


def _peer(sock: socket.socket) -> Caller:
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return Caller(uid=uid, pid=pid, user=user, gid=gid)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client may send many requests on one connection
    server: ApiServer

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        handler = self.server.routes.get((method, url.path.removeprefix(PREFIX)))
        try:
            if not url.path.startswith(PREFIX + "/") or handler is None:
                raise errors.NotFound(f"no such API call: {method} {url.path}")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                raise errors.SpecError("the request body is not valid JSON") from None
            status, reply = 200, handler(self.server.caller_of(self.connection), query, body)
        except errors.XceError as err:
            status = next((code for kind, code in _STATUS.items() if isinstance(err, kind)), 500)
            reply = {"error": str(err), "kind": type(err).__name__}
        except Exception as err:  # a bug: answer, and keep serving others
            self.server.log(f"internal error on {method} {self.path}: {err!r}")
            status, reply = 500, {"error": f"internal error in the controller: {err!r}; see its log",
                                  "kind": "XceError"}
        payload = json.dumps(reply, ensure_ascii=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would flood the controller's log


class ApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: Path, routes: Routes, log: Callable[[str], None], mode: int = 0o600):
        self.routes = routes
        self.log = log
        path.unlink(missing_ok=True)  # a stale socket of a dead controller; we hold the home's lock
        old = os.umask(0o777 & ~mode)
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)

    def caller_of(self, sock: socket.socket) -> Caller:
        return _peer(sock)
