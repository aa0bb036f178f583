"""`xce web` in a real browser against a real controller with real jobs, and /metrics parsed for real.

One cluster for the module: a running job (writing output), a held one, one waiting for its
dependency, one waiting for slots, one DONE, one EXIT, an array and a flow; and a host nobody
answers for (an ssh host on a closed loopback port), out of reach, then lost. Headless Chromium loads
every page, checks the DOM (ids, states, reasons, host rows) and keeps a screenshot of each; any
console error or uncaught exception fails the test. The last test breaks things in order: a job
changes state under an open page (which must follow without a reload), then the controller stops
and starts again under it.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import readme
from tests.support.browser import Browser, require_browser, shots_dir
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from tests.support.web import Web, dashboard, start_web

SECRET = "s3cr3t-value-of-the-env"
FLOW = """\
name: webflow
steps:
  first:
    command: [sh, -c, "echo first"]
  second:
    command: [sh, -c, "echo second"]
    after: [first]
  third:
    command: [sh, -c, "echo third"]
    after: [first]
"""


CONFIG = """\
cluster: w{pid}
hosts:
  - {{name: local, slots: 2, mem: 1G}}
  - {{name: ghost, type: ssh, address: 127.0.0.1, port: 1, slots: 1, mem: 1G}}
queues:
  - {{name: normal, default: true}}
controller: {{tick: 1s, grace: 2s, host_lost_after: 8s, lease: 5s, lease_margin: 2s}}
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_browser()
    c = Cluster(config=CONFIG.format(pid=os.getpid()))
    try:
        c.start()
        jobs = {"done": c.submit("sh", "-c", "echo hello-from-web-test", options=("-J", "greeter"))}
        jobs["exit"] = c.submit("sh", "-c", "echo failing; exit 3", options=("-J", "failer"))
        assert c.xce("wait", str(jobs["done"]), str(jobs["exit"])).returncode == 1
        flow = c.work / "flow.yaml"
        flow.write_text(FLOW)
        c.ok("flow", "submit", str(flow))
        jobs["array"] = c.submit("true", options=("-J", "sweep[1-3]"))
        wait_until(lambda: all(j["state"] == "DONE" for j in json.loads(c.ok("jobs", "--json", "-a"))["jobs"]
                               if j["name"] in ("first", "second", "third", "sweep")), 60, "the flow and the array")
        jobs["run"] = c.submit("sh", "-c", "echo started-and-running; sleep 300", options=(
            "-J", "runner", "--env", f"XCE_WEB_SECRET={SECRET}"))
        c.wait_state(jobs["run"], {"RUN"})
        jobs["held"] = c.submit("sh", "-c", "echo released", options=("-J", "holder", "--hold"))
        jobs["dep"] = c.submit("true", options=("-J", "follower", "-w", f"done({jobs['run']})"))
        jobs["big"] = c.submit("true", options=("-J", "wide", "-n", "2"))
        wait_until(lambda: (c.job(jobs["big"])["pend_reason"] or "").startswith("needs"), 30, "job big's reason")
        with dashboard(c, shots_dir(tmp_path_factory.mktemp("web"))) as (web, browser):
            yield c, web, browser, jobs
    finally:
        c.close()


def _open(browser: Browser, web: Web, path: str):
    """A page at `path`, entered through the printed link (its token becomes the port's cookie)."""
    page = browser.page()
    page.goto(web.link)
    page.wait_for_selector("#totals")
    if path != "/":
        page.goto(web.base + path.lstrip("/"))
    return page


def test_every_page_shows_the_jobs_hosts_and_reasons(site) -> None:
    c, web, browser, jobs = site
    page = _open(browser, web, "/")
    assert page.inner_text("#you")
    assert page.inner_text("#totals [data-state=RUN] .card-n") == "1"
    assert page.inner_text("#totals [data-state=PSUSP] .card-n") == "1"
    assert page.inner_text("#totals [data-state=PEND] .card-n") == "2"
    assert page.locator("#hosts tr[data-host=local]").count() == 1
    assert "slots" in page.inner_text("#hosts tr[data-host=local]") and "1 / 2" in page.inner_text("#hosts")
    assert "dependency" in page.inner_text("#reason-kinds") and "resources" in page.inner_text("#reason-kinds")
    page.wait_for_selector("[data-chart=utilisation][data-drawn='1'] canvas")
    page.wait_for_selector("[data-chart=queue][data-drawn='1'] canvas")
    browser.shot(page, "overview")

    page.goto(web.base + "jobs?user=all&finished=1")
    rows = {r.get_attribute("data-job"): r for r in page.locator("#jobs tbody tr[data-job]").all()}
    for key in ("done", "exit", "run", "held", "dep", "big", "array"):
        assert str(jobs[key]) in rows, f"job {key} ({jobs[key]}) is not listed"
    assert rows[str(jobs["done"])].get_attribute("data-state") == "DONE"
    assert "exit code 3" in rows[str(jobs["exit"])].inner_text()
    assert f"waiting for its dependency: done({jobs['run']})" in rows[str(jobs["dep"])].inner_text()
    assert "needs at least 2 tasks" in rows[str(jobs["big"])].inner_text()
    assert "held" in rows[str(jobs["held"])].inner_text()
    browser.shot(page, "jobs")

    page.goto(web.base + "jobs?state=PEND&name=wid")  # the filters: state and a part of the name
    assert [r.get_attribute("data-job") for r in page.locator("#jobs tbody tr[data-job]").all()] == [str(jobs["big"])]

    page.goto(web.base + f"jobs/{jobs['run']}")
    page.wait_for_selector("#tail")
    assert page.inner_text("#job-state") == "RUN"
    assert "started-and-running" in page.inner_text("#tail")  # read on its host through the agent
    assert [e.get_attribute("data-event") for e in page.locator("#history tbody tr").all()][:3] == [
        "submitted", "dispatched", "started"]
    assert "tasks" in page.inner_text("#effective")  # each effective value with its origin
    assert page.locator("#effective td.origin").count() >= 3
    browser.shot(page, "job")

    page.goto(web.base + f"jobs/{jobs['big']}")
    assert "needs at least 2 tasks" in page.inner_text("#job-why")
    assert "local" in page.inner_text(".why-lines")  # `xce why`'s per-host lines

    page.goto(web.base + f"jobs/{jobs['done']}")
    assert "hello-from-web-test" in page.inner_text("#tail")

    page.goto(web.base + urllib.parse.quote(f"jobs/{jobs['array']}[2]"))
    assert page.inner_text("#job-id") == f"{jobs['array']}[2]" and page.inner_text("#job-state") == "DONE"

    page.goto(web.base + "hosts")
    host = page.locator("#hosts tr[data-host=local]")
    assert host.get_attribute("data-state") == "ok"
    assert str(jobs["run"]) in host.locator(".running").inner_text()
    page.wait_for_selector("#hosts tr[data-host=ghost][data-state=lost]", timeout=30_000)  # live, no reload
    assert "since" in page.inner_text("#hosts tr[data-host=ghost]")
    browser.shot(page, "hosts")

    page.goto(web.base + "flows")
    page.click("#flows a:text('webflow')")
    page.wait_for_selector("#flow-graph")
    steps = {n.get_attribute("data-step"): n.get_attribute("data-state")
             for n in page.locator("#flow-graph g.node").all()}
    assert steps == {"first": "DONE", "second": "DONE", "third": "DONE"}
    assert page.locator("#flow-graph path.edge").count() == 2
    browser.shot(page, "flow")

    page.goto(web.base + "accounting")
    user = c.job(jobs["done"])["user"]
    assert page.locator(f"#by-user tr[data-user='{user}']").count() == 1
    assert "issue 17" in page.inner_text("#accounting-note")
    page.wait_for_selector("[data-chart=accounting][data-drawn='1'] canvas")
    browser.shot(page, "accounting")

    for path in ("/", "jobs?user=all&finished=1", f"jobs/{jobs['run']}", "hosts", "flows/webflow", "accounting"):
        html = web.get(path)[1]
        assert SECRET not in html, f"{path} shows a job's environment"
        assert not re.search(r'(src|href)="(https?:)?//', html), f"{path} loads something from elsewhere"
    page.close()
    browser.check()


def test_pages_need_the_token_and_say_who_can_see(site) -> None:
    c, web, _browser, jobs = site
    status, body = web.get("/", token=False)
    assert status == 403 and "xce web" in body and str(jobs["run"]) not in body
    assert web.get("jobs/" + str(jobs["run"]), token=False)[0] == 403
    assert web.get("/")[0] == 200
    assert "only this machine can connect, and only with this link" in "\n".join(web.notice)
    port = web.base.rsplit(":", 1)[1].strip("/")
    taken = c.xce("web", "--port", port, timeout=60)
    assert taken.returncode == 2 and "choose another with --port" in taken.stderr and "Traceback" not in taken.stderr
    wrong = c.xce("web", "--bind", "not-an-address", timeout=60)
    assert wrong.returncode == 2 and "check the address given to --bind" in wrong.stderr
    wide = start_web(c, "--bind", "127.0.0.2", "--no-token")
    try:
        text = "\n".join(wide.notice)
        assert "bound to 127.0.0.2, not to localhost" not in text  # a loopback address is still this machine
        assert "anyone logged in here can open it" in text
        assert wide.get("/", token=False)[0] == 200
    finally:
        wide.stop()


def test_the_readmes_command_prints_its_link_as_the_readme_says(site) -> None:
    """The README's `served` block, run as printed (on a free port: its 8090 may be taken here)."""
    c, _web, _browser, _jobs = site
    [block] = [b for b in readme.blocks() if b.kind == "served"]
    [command] = block.commands()
    words = command.text.split("#", 1)[0].split()
    said = command.text.split("#", 1)[1].strip()  # what the README shows it printing
    assert words[:2] == ["xce", "web"]
    shown = start_web(c, *words[2:])
    try:
        [link] = [line for line in shown.notice if "serving http" in line]
        port = shown.base.rsplit(":", 1)[1].strip("/")
        assert readme.pattern(said.replace(":8090/", f":{port}/"), c.home).fullmatch(link.strip()), link
    finally:
        shown.stop()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict, name: str, sample: str | None = None, **labels: str) -> float:
    found = [s.value for s in families[name].samples
             if s.name == (sample or name) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{sample or name}{labels}: {found}"
    return found[0]


def test_metrics_parse_and_count_what_happened(site) -> None:
    c, web, _browser, _jobs = site
    status, text = web.get("/metrics", token=False)
    assert status == 200
    families = _families(text)
    assert _value(families, "xce_controller_up") == 1
    assert _value(families, "xce_jobs", queue="normal", state="RUN") == 1
    assert _value(families, "xce_jobs", queue="normal", state="PSUSP") == 1
    assert _value(families, "xce_jobs", queue="normal", state="PEND") == 2
    for kind, n in (("held", 1), ("dependency", 1), ("resources", 1)):
        assert _value(families, "xce_jobs_pending_reason", kind=kind) == n
    assert _value(families, "xce_host_slots", host="local") == 2
    assert _value(families, "xce_host_slots_used", host="local") == 1
    assert _value(families, "xce_host_up", host="local") == 1
    assert _value(families, "xce_host_up", host="ghost") == 0
    assert [_value(families, "xce_hosts", state=s) for s in ("up", "unreach", "lost")] == [1, 0, 1]
    submitted = 2 + 3 + 3 + 4  # two jobs, the flow's three steps, three elements, four more jobs
    assert _value(families, "xce_submits", "xce_submits_total") == submitted
    # each job's attempt counts its dispatches: an element queued behind another on the host and
    # withdrawn to a slot that freed first (prefill) is dispatched twice
    attempts = sum(j["attempt"] for j in json.loads(c.ok("jobs", "--json", "-a", "--elements"))["jobs"])
    assert attempts >= 2 + 3 + 3 + 1 and _value(families, "xce_dispatches", "xce_dispatches_total") == attempts
    assert _value(families, "xce_finished", "xce_finished_total", state="EXIT") == 1
    for name in ("xce_tick_duration_seconds", "xce_scheduler_session_duration_seconds"):
        assert families[name].type == "histogram"
        count = _value(families, name, f"{name}_count")
        assert count > 0 and _value(families, name, f"{name}_bucket", le="+Inf") == count
    once = _families(c.ok("metrics"))
    assert set(once) == set(families)
    assert _value(once, "xce_submits", "xce_submits_total") == submitted


def test_a_page_follows_changes_and_outlives_a_controller_restart(site) -> None:
    c, web, browser, jobs = site
    page = _open(browser, web, f"jobs/{jobs['held']}")
    assert page.inner_text("#job-state") == "PSUSP"
    page.evaluate("window.__sameDocument = 42")
    c.ok("kill", str(jobs["run"]))  # frees the slots: the held job runs once released, the wide one too
    c.ok("release", str(jobs["held"]))
    page.wait_for_selector("#job-state .st-DONE", timeout=60_000)
    assert "released" in page.inner_text("#tail")
    assert page.evaluate("window.__sameDocument") == 42  # updated in place, never reloaded

    overview = _open(browser, web, "/")
    overview.evaluate("window.__sameDocument = 7")
    c.ok("controller", "stop")
    overview.wait_for_selector("#error", timeout=30_000)
    assert "controller is not running" in overview.inner_text("#error")
    assert web.get("/")[0] == 503
    assert _value(_families(web.get("/metrics")[1]), "xce_controller_up") == 0
    down = c.xce("metrics")
    assert down.returncode == 3 and "xce_controller_up 0" in down.stdout
    c.start()
    overview.wait_for_selector("#totals", timeout=30_000)
    assert overview.evaluate("window.__sameDocument") == 7
    assert overview.locator("#hosts tr[data-host=local]").count() == 1
    browser.shot(overview, "overview-after-restart")
    page.close()
    overview.close()
    browser.check()
