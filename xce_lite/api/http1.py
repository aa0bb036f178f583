"""HTTP/1.1 requests as the API server reads them: a pure parser of bytes, strict by design.

Our only clients are xce_lite's (`api/client.py`, the web process) and scripts: a request that is
not plain HTTP/1.1 with a Content-Length and a UTF-8 JSON body is refused with the status that says
why (400, 405, 413, 431), never half-read and never passed on to a handler. Invariants:
- nothing here reads a socket or a clock: `parse` sees the bytes received so far and answers "a
  whole request", "not yet", or `Malformed`;
- a body is never buffered beyond `max_body` (its length is checked from the head alone);
- a decoded body is a JSON object (or nothing), at most MAX_DEPTH deep, without NaN or Infinity.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

MAX_DEPTH = 64  # our own bodies nest 5 deep; a deeper one is an attack or a bug
METHODS = ("GET", "POST")
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           409: "Conflict", 413: "Content Too Large", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 503: "Service Unavailable"}


class Malformed(Exception):
    """The request cannot be served as sent: `status` and a message saying what to send instead."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    body: bytes
    keep_alive: bool


def parse(buffer: bytes | bytearray, max_head: int, max_body: int) -> tuple[Request, int] | None:
    """The whole request at the start of `buffer` and how many bytes it took, or None if more bytes
    are needed. Raises Malformed as soon as the bytes so far cannot become an acceptable request."""
    end = buffer.find(b"\r\n\r\n", 0, max_head + 4)
    if end < 0:
        if len(buffer) > max_head:
            raise Malformed(431, f"the request head is longer than {max_head} bytes")
        return None
    try:
        head = bytes(buffer[:end]).decode("ascii")
    except UnicodeDecodeError:
        raise Malformed(400, "the request line and headers must be ASCII; percent-encode the path "
                             "and the query (UTF-8)") from None
    line, *header_lines = head.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise Malformed(400, f"not an HTTP/1.x request line: {line[:80]!r}; send e.g. 'GET /xce/v1/status HTTP/1.1'")
    method, target, version = parts
    if method not in METHODS:
        raise Malformed(405, f"method {method[:20]!r} is not served; the API takes GET and POST")
    headers: dict[str, str] = {}
    for header in header_lines:
        name, sep, value = header.partition(":")
        if not sep or not name or name != name.strip():
            raise Malformed(400, f"malformed header line {header[:80]!r}; send 'Name: value'")
        name, value = name.lower(), value.strip()
        if name in headers and headers[name] != value:
            raise Malformed(400, f"the header {name} is given twice with different values")
        headers[name] = value
    if "transfer-encoding" in headers:
        raise Malformed(400, "Transfer-Encoding is not accepted; send the body with a Content-Length")
    length = _content_length(headers.get("content-length"), max_body)
    start = end + 4
    if len(buffer) < start + length:
        return None
    if "?" not in target and "#" not in target:  # most requests (every POST of our clients)
        path, query = target, {}
    else:
        url = urlsplit(target)
        path = url.path
        try:
            query = {k: v[-1] for k, v in parse_qs(url.query, errors="strict").items()}
        except UnicodeDecodeError:
            raise Malformed(400, "the query is not percent-encoded UTF-8") from None
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    request = Request(method, path, query, headers, bytes(buffer[start:start + length]), keep_alive)
    return request, start + length


def _content_length(text: str | None, max_body: int) -> int:
    if text is None or text == "":
        return 0
    if not (text.isascii() and text.isdigit()):
        raise Malformed(400, f"Content-Length must be a whole number of bytes, not {text[:40]!r}")
    length = int(text)
    if length > max_body:
        raise Malformed(413, f"the request body is {length} bytes, more than the {max_body} this controller "
                             f"takes; send fewer jobs per request")
    return length


def decode_body(body: bytes) -> Any:
    """The JSON document a body holds: a JSON object, or None for an empty body; Malformed (400)
    for anything else."""
    if not body:
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Malformed(400, f"the request body is not UTF-8 (byte {err.start}); send JSON in UTF-8") from None
    try:
        doc = _DECODER.decode(text)
    except RecursionError:
        raise Malformed(400, f"the request body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise Malformed(400, f"the request body is not valid JSON ({err})") from None
    if not isinstance(doc, dict):
        raise Malformed(400, f"the request body must be a JSON object, not {type(doc).__name__}")
    # a document nests at most as deep as it has brackets (those in strings count too): most
    # bodies are proved shallow by two counts in C, without a walk over the decoded document
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth(doc) > MAX_DEPTH:
        raise Malformed(400, f"the request body nests deeper than {MAX_DEPTH} levels")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# made once: json.loads with any keyword makes a new decoder (and its scanner) per call, ~3-5 us
# of a one-job POST's request path; a decoder keeps no state between documents
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _depth(doc: Any) -> int:
    """How deep `doc` nests (iteratively: a deep document must not exhaust the stack here)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
    return deepest


def response(status: int, payload: bytes, close: bool) -> bytes:
    """A whole JSON response, head and body."""
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode("ascii") + payload


def error_response(status: int, message: str, kind: str = "XceError", close: bool = True) -> bytes:
    return response(status, json.dumps({"error": message, "kind": kind}, ensure_ascii=True).encode(), close)
