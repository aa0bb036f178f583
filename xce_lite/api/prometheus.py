"""The controller's `/metrics` reply as Prometheus text (exposition format 0.0.4), for `xce metrics`
and `xce web`'s /metrics. Standard library only, on the CLI's side.

Every family has its HELP and TYPE lines and its samples together; label values are escaped as
the format says (backslash, double quote, newline). When the controller does not answer, the
text holds `xce_controller_up 0` alone, so a scrape still says what is wrong.
"""

from __future__ import annotations

from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# resource -> (metric stem, unit suffix): the host resources with metrics of their own
_RESOURCES = {"slots": ("slots", ""), "mem": ("mem", "_bytes"), "gpus": ("gpus", "")}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, Any]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str, samples: list[tuple[str, dict, float]]) -> None:
        self.lines.append(f"# HELP {name} {text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for sample, labels, value in samples:
            self.lines.append(f"{sample}{_labels(labels)} {_number(value)}")


def render(reply: dict[str, Any] | None, error: str | None = None) -> str:
    """The Prometheus text of a `/metrics` reply (None: the controller is down, `error` says why)."""
    out = _Text()
    out.family("xce_controller_up", "gauge", "1 if the controller answered this scrape, else 0.",
               [("xce_controller_up", {}, 0 if reply is None else 1)])
    if reply is None:
        if error:
            out.lines.append(f"# {error.splitlines()[0] if error.splitlines() else error}")
        return "\n".join(out.lines) + "\n"
    out.family("xce_jobs", "gauge", "Unfinished jobs by queue and state.",
               [("xce_jobs", {"queue": j["queue"], "state": j["state"]}, j["count"]) for j in reply["jobs"]])
    out.family("xce_jobs_pending_reason", "gauge",
               "Pending (PEND) and held (PSUSP) jobs by the kind of why they wait.",
               [("xce_jobs_pending_reason", {"kind": k}, n) for k, n in reply["pending_reasons"].items()])
    hosts = reply["hosts"]
    for resource, (stem, unit) in _RESOURCES.items():
        for part, what in (("total", "offered"), ("used", "reserved by jobs")):
            name = f"xce_host_{stem}_used{unit}" if part == "used" else f"xce_host_{stem}{unit}"
            out.family(name, "gauge", f"The host's {resource} {what}.",
                       [(name, {"host": h["name"]}, h["resources"][resource][part])
                        for h in hosts if resource in h["resources"]])
    others = [(h["name"], r, v) for h in hosts for r, v in h["resources"].items() if r not in _RESOURCES]
    for part, what in (("total", "offered"), ("used", "reserved by jobs")):
        name = "xce_host_resource_used" if part == "used" else "xce_host_resource"
        out.family(name, "gauge", f"The host's other resources {what} (in base units).",
                   [(name, {"host": h, "resource": r}, v[part]) for h, r, v in others])
    out.family("xce_host_up", "gauge", "1 if the controller reaches the host's agent, else 0.",
               [("xce_host_up", {"host": h["name"]}, 1 if h["state"] == "up" else 0) for h in hosts])
    states = ("up", "unreach", "lost")
    out.family("xce_hosts", "gauge", "Hosts by state: up, unreach (out of reach), lost (out of reach past "
                                     "host_lost_after; their jobs were handled).",
               [("xce_hosts", {"state": s}, sum(1 for h in hosts if h["state"] == s)) for s in states])
    registry = reply["registry"]
    names = {"tick": "xce_tick_duration_seconds", "session": "xce_scheduler_session_duration_seconds"}
    for key, hist in registry["histograms"].items():
        name = names.get(key, f"xce_{key}_duration_seconds")
        samples = [(f"{name}_bucket", {"le": "+Inf" if le == "+Inf" else repr(float(le))}, n)  # le="1.0", as Go
                   for le, n in hist["buckets"]]
        samples += [(f"{name}_sum", {}, hist["sum"]), (f"{name}_count", {}, hist["count"])]
        out.family(name, "histogram", hist["help"], samples)
    for key, counter in registry["counters"].items():
        name = f"xce_{key}_total"
        series = counter["series"] or ([{"labels": {}, "value": 0}] if key != "finished" else
                                       [{"labels": {"state": s}, "value": 0} for s in ("DONE", "EXIT")])
        out.family(name, "counter", counter["help"], [(name, s["labels"], s["value"]) for s in series])
    return "\n".join(out.lines) + "\n"
