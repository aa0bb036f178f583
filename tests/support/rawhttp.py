"""Reading the API server's replies off a raw socket, for tests that speak HTTP by hand."""

from __future__ import annotations

import json
import socket


def reply(sock: socket.socket) -> tuple[int, dict]:
    """Read one response: (status, JSON body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed without a reply (got {data!r})"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    length = next(int(v) for n, _, v in (line.partition(":") for line in lines[1:]) if n.lower() == "content-length")
    while len(body) < length:
        body += sock.recv(65536)
    return int(lines[0].split()[1]), json.loads(body[:length])
