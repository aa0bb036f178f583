"""The dashboard's pure parts: a flow's graph layout, and a job shown from what the API returned
(only that: a field the controller leaves out is shown hidden, never looked up elsewhere)."""

from __future__ import annotations

from xce_lite.web import pages
from xce_lite.web.flowgraph import NODE_W, layout


def _step(name: str, upstream: list[str], state: str = "DONE", array: bool = False) -> dict:
    return {"step": name, "id": len(name), "array": array, "state": state, "indices": "[1-3]" if array else None,
            "states": {state: 3 if array else 1}, "upstream": upstream}


def test_a_flow_is_drawn_in_columns_by_depth_with_one_edge_per_dependency() -> None:
    graph = layout([_step("prepare", []), _step("simulate", ["prepare"], "RUN", array=True),
                    _step("check", ["prepare"]), _step("collect", ["simulate", "check"], "PEND")])
    x = {n["step"]: n["x"] for n in graph["nodes"]}
    assert x["prepare"] < x["simulate"] == x["check"] < x["collect"]
    assert len(graph["edges"]) == 4 and graph["width"] >= x["collect"] + NODE_W
    assert [n["ref"] for n in graph["nodes"] if n["step"] == "simulate"] == ["8[1-3]"]
    assert layout([_step("a", [])]) == layout([_step("a", [])])  # the same steps, the same picture


WIRE = {"id": 7, "display_id": "7", "name": "sim", "user": "ann", "queue": "normal", "state": "PEND", "slots": 1,
        "hosts": [], "submit_time": 0.0, "start_time": None, "end_time": None, "pend_reason": None, "reason": None,
        "array_index": None}


def test_a_job_the_api_hides_the_command_of_shows_it_hidden() -> None:
    shown = dict(pages._fields({**WIRE, "command": ["./run", "--secret-flag"], "cwd": "/home/ann"}))
    assert shown["command"] == "./run --secret-flag" and shown["waiting"] == "not scheduled yet"
    hidden = dict(pages._fields({**WIRE, "command": None, "cwd": None}))
    assert hidden["command"] == "(hidden)" and hidden["working directory"] == "(hidden)"
    held = dict(pages._fields({**WIRE, "state": "PSUSP", "reason": "held by ann", "command": None}))
    assert held["waiting"] == "held by ann"
