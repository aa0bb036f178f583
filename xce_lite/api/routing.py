"""One API request to its handler and back: the route table's type, and the reply for each outcome.

A request outside PREFIX or with no route is 404; a body that is not JSON is 400; an XceError
becomes its HTTP status (`STATUS`) with `{"error", "kind"}`; any other exception is a bug: logged,
answered 500, and the server serves on. A long poll cut short (the server holds only so many at
their full length) waits at most 1 s (`short_timeout`): its client polls again, as it would anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from xce_lite import errors
from xce_lite.api import http1
from xce_lite.api.caller import Caller

PREFIX = "/xce/v1"
LONG_POLLS = {PREFIX + "/jobs/wait"}  # handlers that wait up to the `timeout` their query gives
STATUS = {errors.SpecError: 400, errors.ConfigError: 400, errors.HomeError: 400,
          errors.NotFound: 404, errors.TransitionError: 409}

# (method, path) -> handler(caller, query, body) -> JSON-able reply
Routes = dict[tuple[str, str], Callable[[Caller, dict[str, str], Any], Any]]


def call(routes: Routes, caller: Caller, request: http1.Request, query: dict[str, str],
         log: Callable[[str], None], settle: Callable[[], None] | None = None) -> tuple[int, bytes]:
    """The status and JSON body answering `request` (with `query`, maybe cut short); never raises.
    `settle`, called once the handler is done, returns once what it may have read is on disk (the
    store's settle_reads); if it cannot say so, the answer is that error instead."""
    method, path = request.method, request.path
    handler = routes.get((method, path.removeprefix(PREFIX)))
    try:
        if not path.startswith(PREFIX + "/") or handler is None:
            raise errors.NotFound(f"no such API call: {method} {path}")
        try:
            body = http1.decode_body(request.body)
        except http1.Malformed as err:
            raise errors.SpecError(str(err)) from None
        status, reply = 200, handler(caller, query, body)
    except errors.XceError as err:
        status = next((code for kind, code in STATUS.items() if isinstance(err, kind)), 500)
        reply = {"error": str(err), "kind": type(err).__name__}
    except Exception as err:  # a bug: answer, and keep serving others
        log(f"internal error on {method} {path}: {err!r}")
        status, reply = 500, {"error": f"internal error in the controller: {err!r}; see its log",
                              "kind": "XceError"}
    if settle is not None:
        try:
            settle()
        except errors.XceError as err:
            status, reply = 500, {"error": str(err), "kind": type(err).__name__}
    return status, json.dumps(reply, ensure_ascii=True).encode()


def short_timeout(timeout: str | None) -> str:
    """A long poll's timeout cut to a short poll's (1 s): the client polls again, as it would anyway."""
    try:
        return str(min(float(timeout if timeout is not None else 30), 1.0))
    except ValueError:
        return timeout or "1"  # the handler says what is wrong with it
