"""Submission a client can trust: a retry after a lost reply never stores a second job (request
ids), whether the reply was lost after the controller stored the job or before; text that cannot
reach a job is refused at submit, naming the field; and `xce jobs` never crashes on what a store
holds, even rows written before these checks existed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from xce_lite import errors
from xce_lite.api.client import Client
from xce_lite.models import JobSpec
from xce_lite.store.jobs import JobStore


def _named(c: Cluster, name: str) -> list[dict]:
    return [j for j in json.loads(c.ok("jobs", "-a", "-u", "all", "--json"))["jobs"] if j["name"] == name]


def _spec(c: Cluster, name: str, **extra) -> dict:
    return {"argv": ["true"], "cwd": str(c.work), "env": {}, "name": name, **extra}


def test_a_repeated_request_id_returns_the_jobs_stored_the_first_time(cluster: Cluster):
    api = Client(cluster.home / "xce.sock")
    one = {"jobs": [_spec(cluster, "once")], "request_id": "test-once-0001"}
    first, again = api.post("/jobs", one), api.post("/jobs", one)
    assert again["ids"] == first["ids"] and again["queues"] == first["queues"] and again.get("repeated")
    # an array and a batch (an array and a job in one request) too
    batch = {"jobs": [_spec(cluster, "sweep", array="1-4"), _spec(cluster, "after", queue="high")],
             "request_id": "test-batch-0001"}
    first_batch, again_batch = api.post("/jobs", batch), api.post("/jobs", batch)
    assert first_batch["sizes"] == [4, None] and again_batch["sizes"] == [4, None]
    assert again_batch["ids"] == first_batch["ids"] and again_batch["queues"] == ["normal", "high"]
    api.close()
    for name, count in (("once", 1), ("after", 1)):
        assert len(_named(cluster, name)) == count
    arrays = json.loads(cluster.ok("jobs", "-a", "--json"))["arrays"]
    assert [a["size"] for a in arrays if a["name"] == "sweep"] == [4]
    bad = Client(cluster.home / "xce.sock")
    with pytest.raises(errors.SpecError, match="request_id must be"):
        bad.post("/jobs", {"jobs": [_spec(cluster, "x")], "request_id": "short"})
    bad.close()


def test_a_reply_lost_after_the_job_was_stored_is_asked_again_and_answered_with_that_job(cluster: Cluster):
    """The controller is frozen (SIGSTOP) while a submission is in flight; the client gives up
    waiting (a lost reply); the controller, thawed, stores the job; the client's retry with the same
    request id is answered with that job, and there is exactly one."""
    reply, notes = _submit_to_a_frozen_controller(cluster, {"jobs": [_spec(cluster, "frozen")]}, "/jobs",
                                                  lambda: _named(cluster, "frozen"))
    assert len(notes) == 1 and "same request id" in notes[0]
    assert reply.get("repeated") is True
    stored = _named(cluster, "frozen")
    assert [j["id"] for j in stored] == reply["ids"]


def _submit_to_a_frozen_controller(cluster: Cluster, body: dict, path: str, stored) -> tuple[dict, list[str]]:
    """POST `body` to `path` with the controller frozen (SIGSTOP): the client gives up waiting (a lost
    reply); at its retry the controller is thawed and `stored()` awaited (the first request's work
    on disk), so the retry, with the same request id, is answered from it. The reply and the
    client's retry notes."""
    pid = cluster.controller_pid
    notes: list[str] = []

    def thaw_and_let_it_store(note: str) -> None:
        notes.append(note)
        os.kill(pid, signal.SIGCONT)
        wait_until(stored, 30, "the first request's submission to be stored")

    os.kill(pid, signal.SIGSTOP)
    try:
        api = Client(cluster.home / "xce.sock", timeout=2)
        reply = api.submit(body, path, on_retry=thaw_and_let_it_store)
    finally:
        os.kill(pid, signal.SIGCONT)
    api.close()
    return reply, notes


def _blocked_in_a_read(pid: int) -> bool:
    """The process has a socket open and sleeps: `xce submit` sent its request and waits for the reply."""
    try:
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state == "S" and any(link.startswith("socket:") for link in fds)


def test_xce_submit_cut_off_by_a_kill_9_asks_again_once_and_leaves_exactly_one_job(cluster: Cluster):
    """In sequence: the controller frozen with `xce submit`'s request unread, then killed (-9), then
    restarted: the CLI says its reply was lost, asks again when the controller is back, prints the
    job id, and the store holds that one job."""
    pid = cluster.controller_pid
    os.kill(pid, signal.SIGSTOP)
    cli = subprocess.Popen([sys.executable, "-m", "xce_lite", "submit", "-J", "cut", "--", "true"],
                           cwd=cluster.work, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wait_until(lambda: _blocked_in_a_read(cli.pid), 30, "xce submit to send its request")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: cluster.controller_pid is None, 10, "the controller to die")
        cluster.start()
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err
    assert "reply was lost" in err and "same request id" in err and "Traceback" not in err
    stored = _named(cluster, "cut")
    assert len(stored) == 1 and f"Job <{stored[0]['id']}>" in out
    assert cluster.xce("wait", str(stored[0]["id"])).returncode == 0


@pytest.mark.parametrize("field, spec_part, words", [
    ("argv", {"argv": ["printf", "x\ud800y"]}, "argv[1]"),
    ("env value", {"argv": ["true"], "env": {"SECRET": "v\udfff"}}, "env.SECRET"),
    ("env name", {"argv": ["true"], "env": {"N\ud800": "v"}}, "env (the name"),
    ("name", {"argv": ["true"], "name": "job\udc00"}, "name"),
])
def test_a_lone_surrogate_is_refused_at_submit_naming_the_field(cluster: Cluster, field, spec_part, words):
    """Observed before: accepted, then the job failed with UnicodeEncodeError in its supervisor."""
    api = Client(cluster.home / "xce.sock")
    with pytest.raises(errors.SpecError) as caught:
        api.post("/jobs", {"jobs": [{"cwd": str(cluster.work), **spec_part}]})
    api.close()
    assert str(caught.value).startswith(words) and "lone surrogate" in str(caught.value)
    assert caught.value.exit_code == 2
    assert json.loads(cluster.ok("jobs", "-a", "--json"))["jobs"] == []


def test_xce_submit_with_a_lone_surrogate_from_a_preset_exits_2_naming_the_field(cluster: Cluster):
    presets = cluster.root / "config" / "xce" / "presets"
    presets.mkdir(parents=True)
    (presets / "odd.json").write_text(json.dumps({"schema": 1, "name": "odd", "options": {"env": ["ODD=a\ud800"]}}))
    env = dict(cluster.env, XDG_CONFIG_HOME=str(cluster.root / "config"))
    result = cluster.xce("submit", "--preset", "odd", "--", "true", env=env)
    assert result.returncode == 2, result.stderr
    assert "env.ODD" in result.stderr and "lone surrogate" in result.stderr and "Traceback" not in result.stderr
    # an undecodable byte is not refused: it reaches the job as that byte
    raw = subprocess.run([sys.executable, "-m", "xce_lite", "submit", "--parsable", "--",
                          "sh", "-c", 'printf %s "$1" > raw.out', "sh", b"a\xffb".decode("utf-8", "surrogateescape")],
                         cwd=cluster.work, env=cluster.env, capture_output=True)
    assert raw.returncode == 0, raw.stderr
    assert cluster.xce("wait", raw.stdout.decode().strip()).returncode == 0
    assert (cluster.work / "raw.out").read_bytes() == b"a\xffb"


def test_xce_jobs_never_crashes_on_what_a_store_holds(idle_cluster: Cluster):
    """Rows the submit checks would now refuse, written straight into the store (as an older
    xce_lite did): `xce jobs`, `-l` and `--json` show them, escaped, and exit 0."""
    c = idle_cluster
    store = JobStore(c.home / "xce.db")
    odd = JobSpec.from_wire({"argv": ["printf", "x\ud800y", "raw\udcff"], "cwd": str(c.work), "hold": True,
                             "env": {"A\ud800": "v\udc00"}, "name": "n\ud800"})
    (job_id,) = store.submit([(odd, "normal")], "someone", 1.0)
    store.close()
    c.start()
    for args in (("jobs", "-a", "-u", "all"), ("jobs", "-a", "-u", "all", "-l"), ("jobs", "-l", str(job_id)),
                 ("jobs", "-a", "-u", "all", "--json")):
        result = subprocess.run([sys.executable, "-m", "xce_lite", *args], cwd=c.work, env=c.env, capture_output=True)
        assert result.returncode == 0, (args, result.stderr)
        assert b"internal error" not in result.stderr and b"\\ud800" in result.stdout
    listed = json.loads(c.ok("jobs", "--json", str(job_id)))["jobs"][0]
    assert listed["command"] == ["printf", "x\ud800y", "raw\udcff"]  # JSON escapes decode back to the text


# ---- flows: `xce flow submit` and `xce flow rescue` are as safe to repeat as `xce submit` ----------------

def _flow(c: Cluster, name: str, first: list[str] | None = None) -> dict:
    return {"name": name, "steps": [{"step": "a", "spec": _spec(c, f"{name}-a", argv=first or ["true"])},
                                    {"step": "b", "spec": _spec(c, f"{name}-b", depend="done(a)")}]}


def _flows_named(c: Cluster, name: str) -> list[dict]:
    api = Client(c.home / "xce.sock")
    try:
        return [f for f in api.get("/flows/list")["flows"] if f["name"] == name]
    finally:
        api.close()


def test_a_flow_repeated_with_its_request_id_is_stored_once_and_a_rescue_too(cluster: Cluster):
    c = cluster
    api = Client(c.home / "xce.sock")
    body = {**_flow(c, "twice", first=["false"]), "request_id": "test-flow-0001"}
    first, again = api.post("/flows", body), api.post("/flows", body)
    assert again.pop("repeated") is True and again == first
    assert len(_flows_named(c, "twice")) == 1 and len(_named(c, "twice-a")) == 1 and len(_named(c, "twice-b")) == 1
    a, b = (s["id"] for s in first["steps"])
    assert c.xce("wait", str(a), str(b)).returncode == 1  # a fails, so b can never run: the flow can be rescued
    rescue = {"name": "twice", "request_id": "test-rescue-0001"}
    rescued = api.post("/flows/rescue", rescue)
    # the repeat comes while the rescued steps are unfinished, which a new rescue would refuse
    assert api.post("/flows/rescue", rescue) == {**rescued, "repeated": True}
    assert len(_flows_named(c, "twice")) == 2 and len(_named(c, "twice-a")) == 2
    # a request id names one kind of submission: a job's is not a flow's, nor the other way round
    with pytest.raises(errors.SpecError, match="was used for a flow submission"):
        api.post("/jobs", {"jobs": [_spec(c, "x")], "request_id": "test-flow-0001"})
    api.post("/jobs", {"jobs": [_spec(c, "y")], "request_id": "test-jobs-0002"})
    with pytest.raises(errors.SpecError, match="was used for a job submission"):
        api.post("/flows", {**_flow(c, "other"), "request_id": "test-jobs-0002"})
    api.close()
    assert _named(c, "x") == [] and _flows_named(c, "other") == []


def test_a_flow_reply_lost_after_the_flow_was_stored_is_answered_with_that_flow(cluster: Cluster):
    """As for a job (above): the controller frozen while the flow is in flight, the client gives up
    waiting, the thawed controller stores the flow, the retry gets its steps, and there is one."""
    reply, notes = _submit_to_a_frozen_controller(cluster, _flow(cluster, "frozen"), "/flows",
                                                  lambda: _named(cluster, "frozen-b"))
    assert len(notes) == 1 and "same request id" in notes[0]
    assert reply.get("repeated") is True and [s["step"] for s in reply["steps"]] == ["a", "b"]
    assert [j["id"] for j in _named(cluster, "frozen-a") + _named(cluster, "frozen-b")] == \
        [s["id"] for s in reply["steps"]]
    assert len(_flows_named(cluster, "frozen")) == 1


def test_xce_flow_submit_cut_off_then_killed_then_restarted_leaves_exactly_one_flow(cluster: Cluster):
    """In sequence: the controller frozen with `xce flow submit`'s request unread, killed (-9),
    restarted: the CLI says its reply was lost, asks again, prints the steps; one flow, and it runs."""
    c = cluster
    (c.work / "cut.yaml").write_text("name: cutflow\nsteps:\n  a: {command: [\"true\"]}\n"
                                     "  b: {command: [\"true\"], after: [a]}\n")
    pid = c.controller_pid
    os.kill(pid, signal.SIGSTOP)
    cli = subprocess.Popen([sys.executable, "-m", "xce_lite", "flow", "submit", "cut.yaml"],
                           cwd=c.work, env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _blocked_in_a_read(cli.pid), 30, "xce flow submit to send its request")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: c.controller_pid is None, 10, "the controller to die")
        c.start()
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err
    assert "reply was lost" in err and "same request id" in err and "Traceback" not in err
    assert len(_flows_named(c, "cutflow")) == 1
    steps = json.loads(c.ok("flow", "status", "--json", "cutflow"))["flow"]["steps"]
    assert out.startswith(f"Flow <cutflow> is submitted: a <{steps[0]['id']}>, b <{steps[1]['id']}>.")
    assert c.xce("wait", str(steps[0]["id"]), str(steps[1]["id"])).returncode == 0
    assert len(json.loads(c.ok("jobs", "-a", "--json"))["jobs"]) == 2
