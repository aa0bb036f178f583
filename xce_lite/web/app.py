"""The dashboard's web application (Starlette, Jinja2 templates, assets shipped in the package).

Read-only: every route is a GET that reads the controller's API (source.py) and renders a page.
A page asks again for its `<main>` every few seconds (static/live.js sends `X-Xce-Live: 1`, and the
reply is that block alone), so it stays live without a reload. Pages never run inline script
(the Content-Security-Policy says so): data for charts travels as JSON in a non-executable tag.

Access: unless started with no token, every page needs the token `xce web` printed in its link
(once given, a cookie for this port carries it; Jupyter does the same), so another user of the
machine cannot read your jobs' output through your dashboard. `/metrics` is open: aggregate
numbers only, as a Prometheus scraper expects.
"""

from __future__ import annotations

import hmac
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from xce_lite import errors
from xce_lite.api import prometheus
from xce_lite.web import pages
from xce_lite.web.source import Source

HERE = Path(__file__).parent
log = logging.getLogger("xce.web")
NAV = (("/", "Overview"), ("/jobs", "Jobs"), ("/hosts", "Hosts"), ("/flows", "Flows"), ("/accounting", "Accounting"))
OPEN_PATHS = ("/metrics", "/static/")
_STATUS = ((errors.ControllerDown, 503), (errors.NotFound, 404), (errors.SpecError, 400),
           (errors.TransitionError, 403))
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                      "img-src 'self' data:; frame-ancestors 'none'",
           "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


class TokenGate:
    """ASGI middleware: a request needs the token (`?token=`, the port's cookie, or a Bearer header)."""

    def __init__(self, app, token: str | None, port: int):
        self.app, self.token, self.cookie = app, token, f"xce_web_{port}"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.token is None or scope["path"].startswith(OPEN_PATHS):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.query_params.get("token")
        if given is not None and hmac.compare_digest(given, self.token):
            # Set the cookie and go on without the token in the address (it would stay in the history).
            rest = {k: v for k, v in request.query_params.items() if k != "token"}
            target = scope["path"] + ("?" + urlencode(rest) if rest else "")
            response: Response = RedirectResponse(target, status_code=303)
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path="/")
        elif hmac.compare_digest(request.cookies.get(self.cookie, ""), self.token) or hmac.compare_digest(
                request.headers.get("authorization", ""), f"Bearer {self.token}"):
            await self.app(scope, receive, send)
            return
        else:
            response = PlainTextResponse(
                "This dashboard needs its link with the token: open the address `xce web` printed when it "
                "started (…/?token=…), or start it again.\n", status_code=403, headers=HEADERS)
        await response(scope, receive, send)


def create_app(source: Source, token: str | None, port: int, refresh: float = 3.0) -> Any:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.globals.update(nav=NAV, refresh=refresh)
    env.filters["when"] = pages.when
    # the macros as a global, not `{% import %}`: a main block rendered alone (a live update) does
    # not run its template's top-level imports
    env.globals["m"] = env.get_template("_macros.html").module

    def render(request: Request, template: str, build, *args) -> Response:
        """The page, or (asked by live.js) its main block alone; an XceError as a banner in it."""
        live = request.headers.get("x-xce-live") == "1"
        context: dict[str, Any] = {"path": request.url.path, "query": dict(request.query_params), "error": None,
                                   "now": pages.when(time.time())}
        status = 200
        try:
            context.update(build(source, *args))
        except errors.XceError as err:
            status = next((code for kind, code in _STATUS if isinstance(err, kind)), 502)
            context["error"] = str(err)
            template = "error.html"
        except Exception as err:  # a bug: say so on the page, keep serving the other pages
            log.exception("xce web: internal error on %s", request.url.path)
            status, template = 500, "error.html"
            context["error"] = f"internal error in xce web: {err!r}; its output has the details"
        try:
            t = env.get_template(template)
            html = "".join(t.blocks["main"](t.new_context(context))) if live else t.render(context)
        except Exception as err:  # the page's template failed on these data: a bug, shown as one
            log.exception("xce web: internal error rendering %s", template)
            t, context["error"], status = env.get_template("error.html"), f"internal error in xce web: {err!r}", 500
            html = "".join(t.blocks["main"](t.new_context(context))) if live else t.render(context)
        if live:  # 200 with the error in the fragment: an error status would be a console error in the page
            status = 200
        return HTMLResponse(html, status_code=status, headers={**HEADERS, "X-Xce-Fragment": "1"})

    def number(request: Request, name: str, default: float, low: float, high: float) -> float:
        try:
            value = float(request.query_params.get(name, default))
        except ValueError:
            return default
        return min(high, max(low, value))

    def overview(request: Request) -> Response:
        return render(request, "overview.html", pages.overview, number(request, "hours", 6, 0.05, 24 * 7))

    def jobs(request: Request) -> Response:
        filters = {k: request.query_params.get(k, "").strip() for k in pages.FILTERS}
        return render(request, "jobs.html", pages.jobs, filters)

    def job(request: Request) -> Response:
        return render(request, "job.html", pages.job, request.path_params["ref"])

    def hosts(request: Request) -> Response:
        return render(request, "hosts.html", pages.hosts)

    def flows(request: Request) -> Response:
        return render(request, "flows.html", pages.flows)

    def flow(request: Request) -> Response:
        return render(request, "flow.html", pages.flow, request.path_params["name"])

    def accounting(request: Request) -> Response:
        return render(request, "accounting.html", pages.accounting, number(request, "days", 7, 1, 366))

    def metrics(request: Request) -> Response:
        try:
            text = prometheus.render(source.get("/metrics"))
        except errors.XceError as err:
            text = prometheus.render(None, str(err))
        return Response(text, media_type=prometheus.CONTENT_TYPE)

    routes = [Route("/", overview), Route("/jobs", jobs), Route("/jobs/{ref}", job), Route("/hosts", hosts),
              Route("/flows", flows), Route("/flows/{name}", flow), Route("/accounting", accounting),
              Route("/metrics", metrics), Mount("/static", StaticFiles(directory=HERE / "static"), name="static")]
    return TokenGate(Starlette(routes=routes), token, port)
