"""A flow's graph laid out for an SVG drawing: steps in columns by their depth (a step one column
right of its deepest upstream step), in the flow's order within a column; edges from each upstream
step to its dependant. Pure: the same steps give the same picture.
"""

from __future__ import annotations

from typing import Any

NODE_W, NODE_H = 180, 46
GAP_X, GAP_Y, MARGIN = 70, 18, 10


def layout(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """{"width", "height", "nodes": [{step, state, label, detail, x, y}], "edges": [{d, state}]}
    for steps as `/flows` returns them (upstream before dependant)."""
    depth: dict[str, int] = {}
    columns: dict[int, list[str]] = {}
    for s in steps:
        d = 1 + max((depth[u] for u in s["upstream"] if u in depth), default=-1)
        depth[s["step"]] = d
        columns.setdefault(d, []).append(s["step"])
    place: dict[str, tuple[int, int]] = {}
    for d, names in columns.items():
        for row, name in enumerate(names):
            place[name] = (MARGIN + d * (NODE_W + GAP_X), MARGIN + row * (NODE_H + GAP_Y))
    nodes, edges = [], []
    for s in steps:
        x, y = place[s["step"]]
        counts = ", ".join(f"{n} {state}" for state, n in sorted(s["states"].items())) if s["array"] else ""
        ref = f"{s['id']}{s.get('indices') or '[]'}" if s["array"] else str(s["id"])
        nodes.append({"step": s["step"], "state": s["state"], "ref": ref, "id": s["id"], "detail": counts,
                      "x": x, "y": y})
        for u in s["upstream"]:
            if u not in place:
                continue
            ux, uy = place[u]
            x1, y1, x2, y2 = ux + NODE_W, uy + NODE_H // 2, x, y + NODE_H // 2
            mid = (x1 + x2) // 2
            edges.append({"d": f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}", "state": s["state"]})
    width = MARGIN * 2 + (max(columns, default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = MARGIN * 2 + max((len(c) for c in columns.values()), default=1) * (NODE_H + GAP_Y) - GAP_Y
    return {"width": width, "height": height, "node_w": NODE_W, "node_h": NODE_H, "nodes": nodes, "edges": edges}
