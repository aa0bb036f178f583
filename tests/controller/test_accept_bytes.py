"""Accepting jobs stores and answers exactly what it did before the accept path was made cheaper
(issue 18): the replies, every stored row (jobs, arrays, events, request ids) and the controller's
in-memory view (pending set, gate, held) after one job, batches with repeated and distinct specs,
arrays (throttled, held, with a dependency), a repeated request id and refused batches.

The expected values are tests/data/accept_golden.json, written by the accept path as it was on main
(c7b5d6e) with `python -m tests.controller.test_accept_bytes --write`; the real controller runs
in-process (tests/support/inproc.py: fake clock, so every time is START) on a real SQLite store.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from tests.support.inproc import START
from xce_lite import errors
from xce_lite.sim.controlled import Controlled, _me

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "accept_golden.json"
CONFIG = """\
cluster: accept
hosts:
  - {name: h1, slots: 4, mem: 1G}
  - {name: h2, slots: 4, mem: 1G}
queues:
  - {name: normal, default: true}
  - {name: high, priority: 40}
projects:
  - {name: lab, members: [USER]}
  - {name: lab/vision, members: [USER]}
default_project: lab
"""


def _requests(work: str) -> list[dict]:
    base = {"argv": ["true"], "cwd": work, "env": {"PATH": "/usr/bin:/bin", "ODD": "\udc80x"}, "name": "b",
            "stdout": f"{work}/out-%J"}
    return [
        {"jobs": [base]},
        {"jobs": [base, base, dict(base, hold=True), dict(base, queue="high", priority=5),
                  dict(base, name="w", depend="done(1)"), dict(base, name="t", array="1-4%2"),
                  dict(base, name=None, argv=["/bin/echo", "x"]), dict(base, project="lab/vision"),
                  dict(base, slots=2, max_slots=3, resreq=["rusage[mem=10M]"]), base]},
        {"jobs": [dict(base, name="sweep", array="1-30")]},
        {"jobs": [dict(base, name="late", array="3-9:3", hold=True, depend="ended(b)")]},
        {"jobs": [dict(base, name="dep", array="1-3", depend="done(sweep)")]},
        {"jobs": [base, dict(base, name="again")], "request_id": "accept-golden-0001"},
        {"jobs": [base, dict(base, name="again")], "request_id": "accept-golden-0001"},  # a repeat: nothing new
        {"jobs": [dict(base, name="n1"), base, dict(base, cwd="/nonexistent/dir")]},  # refused: job 3
        {"jobs": [base, dict(base, queue="nosuch")]},  # refused: job 2
        {"jobs": [dict(base, name="x", depend="done(nosuchname)")]},  # refused
        {"jobs": []},  # refused
        {"jobs": [base] * 3 + [dict(base, array="1-2")] * 2},  # repeated specs and arrays in one batch
    ]


def observed() -> dict:
    """Everything an accept leaves behind, as JSON-able values, with the run's paths and user named."""
    root = Path(tempfile.mkdtemp(prefix="xce-accept-"))
    work = root / "work"
    work.mkdir()
    (root / "xce.yaml").write_text(CONFIG.replace("USER", _me()))
    ip = Controlled(root, START)
    try:
        ctl, caller = ip.ctl, ip.caller()
        replies = []
        for body in _requests(str(work)):
            try:
                replies.append(ctl.api_submit(caller, {}, body))
            except errors.XceError as err:
                replies.append({"error": str(err), "kind": type(err).__name__})
        con = ctl.store._reader()
        tables = {table: [list(row) for row in con.execute(f"SELECT * FROM {table} ORDER BY {order}")]
                  for table, order in (("jobs", "id"), ("arrays", "id"), ("events", "seq"),
                                       ("submit_requests", "request_id"))}
        state, gate = ctl.state, ctl.gating.gate
        with state.mu:
            memory = {"pending": [repr(state.pending.get(i)) for i in sorted(state.pending)],
                      "gate": sorted(gate.waiters), "fed": sorted(gate.fed),
                      "held": sorted(state.held.items()), "dirty": state.dirty}
        text = json.dumps({"replies": replies, "tables": tables, "memory": memory}, ensure_ascii=True,
                          indent=1, sort_keys=True)
        text = text.replace(str(work), "WORK").replace(json.dumps(caller.user)[1:-1], "USER")
        return json.loads(text)
    finally:
        ip.close()
        shutil.rmtree(root, ignore_errors=True)


def test_accepting_stores_and_answers_exactly_what_it_did_before():
    assert observed() == json.loads(GOLDEN.read_text(encoding="ascii"))


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps(observed(), ensure_ascii=True, indent=1, sort_keys=True) + "\n", encoding="ascii")
