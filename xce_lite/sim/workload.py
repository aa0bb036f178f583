"""A workload: what the simulator submits, when, and how each job behaves once it runs.

A YAML file (`jobs:` a list of mappings) or a CSV file (a header row naming the same fields). Each
job, with its defaults:

    submit    seconds from the start (a number, or `90s`, `10m`, `2h`); required
    user      who submits it ("user")             queue     its queue (the cluster's default)
    app       its application profile (the cluster's default_application; "" for none)
    n         tasks: `4` or `2,8` (-n min,max)     R         the -R text, or a list of them
    runtime   seconds it runs once started; required        exit      its exit code (0)
    name      its name (-J), what dependencies refer to     priority  -sp 0..100 (0)
    W         run limit (-W), M memory limit (-M)            after     a dependency (-w): done(a) && ended(b)
    project   its project (-P): checked and defaulted as the controller does, for the user in no group
    array     `name[1-100]%10`: that many elements, at most 10 running at once (`name` is then the
              array's name; the elements are name[1], name[2], ...)
    retry     a failed attempt is requeued up to this many times (--retry; 0..the controller's maximum)

A YAML workload may also list host events (`hosts:` a list of mappings; not in CSV):

    host      the host's name in the config; required      lost      when its channel is cut; required
    back      when it connects again (never, if not given)

A lost host's units stop by themselves once the lease runs out; the controller declares it lost after
`host_lost_after`, as it would with a real host (sim/ticked.py runs the controller's own tick).

Dependencies and arrays are the controller's own (deps.py, arrays.py, gate.py): a job's `after` is
resolved when it is submitted, by the controller, as `-w` is.

Times are seconds; a string with a unit goes through units.parse_duration, a plain number string
(CSV) is seconds. Bad input raises SpecError listing every mistake at once, each naming the file,
the job (its row) and line, and the field, with what to write instead; nothing is half-read.
`digest` is a hash of the parsed jobs: recordings and snapshots carry it, so a verify against
another workload says so instead of reporting noise.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from xce_lite.errors import SpecError
from xce_lite.models import MAX_RETRIES
from xce_lite.quantities import parse_duration, parse_size
from xce_lite.workflow import arrays, deps

FIELDS = ("submit", "user", "queue", "app", "n", "R", "runtime", "exit", "name", "priority", "W", "M", "after",
          "array", "project", "retry")
HOST_FIELDS = ("host", "lost", "back")
_NUMBER = re.compile(r"^\d+(\.\d+)?$")


@dataclass(frozen=True)
class WorkloadJob:
    """One workload entry (an array entry stands for all its elements). `row` is its place in the
    file, 1-based: what messages name."""

    row: int
    submit: float
    runtime: float
    user: str = "user"
    queue: str | None = None
    app: str | None = None
    slots: int | None = None
    max_slots: int | None = None
    resreq: tuple[str, ...] = ()
    exit_code: int = 0
    name: str | None = None
    priority: int = 0
    run_limit: float | None = None
    mem_limit: int | None = None
    after: str | None = None
    array: tuple[str, tuple[int, ...], int | None] | None = None  # (name, indices, at most running)
    project: str | None = None  # -P
    retry: int | None = None  # --retry


@dataclass(frozen=True)
class HostEvent:
    """A host's channel cut at `lost` (seconds), connected again at `back` (None: never)."""

    host: str
    lost: float
    back: float | None = None


@dataclass(frozen=True)
class Workload:
    jobs: tuple[WorkloadJob, ...]
    source: str  # the file, for messages
    hosts: tuple[HostEvent, ...] = ()

    @property
    def digest(self) -> str:
        # a field added later counts only when given, so that a workload's digest stays what it was
        rows: list = [{k: v for k, v in asdict(j).items() if k not in ("project", "retry") or v is not None}
                      for j in self.jobs]
        if self.hosts:
            rows.append({"hosts": [asdict(h) for h in self.hosts]})
        text = json.dumps(rows, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


MAX_PROBLEMS = 50  # a wholly wrong file says its first fifty problems, then how many more


def load_workload(path: Path) -> Workload:
    """Read a .yaml/.yml or .csv workload; SpecError lists every mistake, each with the file, the
    job, its line and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"workload {path}: cannot read it ({err.strerror}); give an existing YAML or CSV file")
    except UnicodeDecodeError as err:
        raise SpecError(f"workload {path}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8")
    lines: list[int | None]
    host_events: tuple[HostEvent, ...] = ()
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        unknown = sorted(set(rows[0]) - set(FIELDS)) if rows else []
        if unknown:
            raise SpecError(f"workload {path} (line 1): unknown column(s) {', '.join(unknown)}; the columns are "
                            f"{', '.join(FIELDS)}")
        rows = [{k: v for k, v in row.items() if v not in (None, "")} for row in rows]
        lines = [i + 1 for i in range(1, len(rows) + 1)]  # the header is line 1
    elif path.suffix.lower() in (".yaml", ".yml"):
        from xce_lite.config import yamlfile  # heavy (yaml): only here

        data, root = yamlfile.parse(text, f"workload {path}", SpecError)
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
            raise SpecError(f"workload {path}: expected a mapping with `jobs:` a list of jobs")
        rows = data["jobs"]
        lines = _yaml_lines(root, len(rows))
        unknown_top = sorted(set(data) - {"jobs", "hosts"}, key=str)
        if unknown_top:
            raise SpecError(f"workload {path}: unknown key(s) {', '.join(map(str, unknown_top))}; a workload has "
                            f"`jobs:` and, optionally, `hosts:` (host events)")
        host_events = _host_events(data.get("hosts"), str(path))
    else:
        raise SpecError(f"workload {path}: name a .yaml, .yml or .csv file")
    jobs, problems = [], []
    for i, row in enumerate(rows, 1):
        found: list[str] = []
        job = parse_job(row, i, str(path), found, lines[i - 1])
        problems.extend(found)
        if job is not None:
            jobs.append(job)
    if problems:
        more = f"\n... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        raise SpecError("\n".join(problems[:MAX_PROBLEMS]) + more + "\nnothing was simulated; fix the workload and "
                        "run again")
    if not jobs:
        raise SpecError(f"workload {path}: it has no jobs; add at least one")
    return Workload(tuple(jobs), str(path), host_events)


def _host_events(value: object, source: str) -> tuple[HostEvent, ...]:
    """`hosts:`: each {host, lost, back?}; SpecError lists every mistake."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError(f"workload {source}: `hosts:` must be a list of host events ({', '.join(HOST_FIELDS)})")
    events, problems = [], []
    for i, row in enumerate(value, 1):
        where = f"workload {source}, host event {i}"
        if not isinstance(row, dict):
            problems.append(f"{where}: expected a mapping of fields ({', '.join(HOST_FIELDS)})")
            continue
        unknown = sorted(set(row) - set(HOST_FIELDS), key=str)
        missing = [k for k in ("host", "lost") if k not in row]
        if unknown or missing:
            problems.append(f"{where}: " + "; ".join(
                ([f"unknown field(s) {', '.join(map(str, unknown))}"] if unknown else [])
                + [f"`{k}` is missing" for k in missing]) + f"; the fields are {', '.join(HOST_FIELDS)}")
            continue
        try:
            host = _text(row, "host", where)
            lost = _seconds(row["lost"], "lost", where)
            back = _seconds(row["back"], "back", where) if row.get("back") is not None else None
        except SpecError as err:
            problems.append(str(err))
            continue
        if back is not None and back <= lost:
            problems.append(f"{where}: `back` ({back:g}) must come after `lost` ({lost:g})")
            continue
        assert host is not None  # required above
        events.append(HostEvent(host, lost, back))
    if problems:
        raise SpecError("\n".join(problems) + "\nnothing was simulated; fix the workload and run again")
    return tuple(events)


def _yaml_lines(root, count: int) -> list[int | None]:
    """The 1-based line each job of `jobs:` starts on."""
    for key, value in getattr(root, "value", []):
        if getattr(key, "value", None) == "jobs" and hasattr(value, "value") and isinstance(value.value, list):
            found: list[int | None] = [node.start_mark.line + 1 for node in value.value][:count]
            return found + [None] * (count - len(found))
    return [None] * count


def parse_job(row: object, index: int, source: str, problems: list[str] | None = None,
              line: int | None = None) -> WorkloadJob | None:
    """One entry. With `problems`, each mistake is added to it (file, job, line, field) and None is
    returned if there was any; without, the first raises SpecError."""
    where = f"workload {source}, job {index}" + (f" (line {line})" if line else "")
    found: list[str] = []

    def field(parse, *args):
        try:
            return parse(*args)
        except SpecError as err:
            found.append(str(err))
            return None

    def fail(message: str) -> None:
        found.append(f"{where}: {message}")

    if not isinstance(row, dict):
        fail(f"expected a mapping of fields ({', '.join(FIELDS)})")
        return _done(None, found, problems)
    unknown = sorted(set(row) - set(FIELDS), key=str)
    if unknown:
        fail(f"unknown field(s) {', '.join(map(str, unknown))}; the fields are {', '.join(FIELDS)}")
    for required in ("submit", "runtime"):
        if required not in row:
            fail(f"`{required}` is missing; give it in seconds")
    slots = max_slots = None
    if "n" in row:
        slots, max_slots = field(_tasks, str(row["n"]), where) or (None, None)
    array = field(_array, str(row["array"]), where) if "array" in row else None
    name = field(_text, row, "name", where)
    if array is not None and name is not None and name != array[0]:
        fail(f"name {name!r} and array {array[0]!r} differ; give the array's name once")
    values = dict(
        submit=field(_seconds, row["submit"], "submit", where) if "submit" in row else None,
        runtime=field(_seconds, row["runtime"], "runtime", where) if "runtime" in row else None,
        user=field(_text, row, "user", where) or "user", queue=field(_text, row, "queue", where),
        resreq=field(_resreq, row.get("R"), where) or (),
        exit_code=field(_int, row.get("exit", 0), "exit", where, 0, 255),
        priority=field(_int, row.get("priority", 0), "priority", where, 0, 100),
        run_limit=field(_seconds, row["W"], "W", where) if "W" in row else None,
        mem_limit=field(_size, row["M"], where) if "M" in row else None,
        after=field(_after, row, where), project=field(_text, row, "project", where),
        retry=field(_int, row["retry"], "retry", where, 0, MAX_RETRIES) if "retry" in row else None)
    if found:
        return _done(None, found, problems)
    return WorkloadJob(
        row=index, submit=values["submit"], runtime=values["runtime"], user=values["user"], queue=values["queue"],
        app=str(row["app"]) if "app" in row and row["app"] is not None else None,
        slots=slots, max_slots=max_slots, resreq=values["resreq"], exit_code=values["exit_code"],
        name=name if array is None else array[0], priority=values["priority"], run_limit=values["run_limit"],
        mem_limit=values["mem_limit"], after=values["after"], array=array,
        project=values["project"], retry=values["retry"])


def _done(job: WorkloadJob | None, found: list[str], problems: list[str] | None) -> WorkloadJob | None:
    if problems is None and found:
        raise SpecError(found[0])
    if problems is not None:
        problems.extend(found)
    return job


def _text(row: dict, key: str, where: str) -> str | None:
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
        raise SpecError(f"{where}: `{key}` must be a non-empty text, not {value!r}")
    return str(value).strip()


def _after(row: dict, where: str) -> str | None:
    """`after`: a -w condition, parsed here so that its mistakes come with the others'."""
    text = _text(row, "after", where)
    if text is not None:
        try:
            deps.parse(text)
        except SpecError as err:
            raise SpecError(f"{where}: `after`: {err}")
    return text


def _resreq(value: object, where: str) -> tuple[str, ...]:
    """`R`: one -R text, or a list of them (selects ANDed, the rest merged, as -R given twice)."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise SpecError(f"{where}: `R` must be a -R text or a list of them, not {value!r}")


def _seconds(value: object, key: str, where: str) -> float:
    if (isinstance(value, (int, float)) and not isinstance(value, bool)) or \
            (isinstance(value, str) and _NUMBER.match(value.strip())):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value, key)
        except SpecError as err:
            raise SpecError(f"{where}: {err}")
    else:
        raise SpecError(f"{where}: `{key}` must be seconds (a number) or a duration such as 10m, not {value!r}")
    if seconds < 0:
        raise SpecError(f"{where}: `{key}` cannot be negative ({value!r})")
    return seconds


def _size(value: object, where: str) -> int:
    try:
        return parse_size(str(value), "M")
    except SpecError as err:
        raise SpecError(f"{where}: {err}")


def _int(value: object, key: str, where: str, low: int, high: int) -> int:
    try:
        number = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise SpecError(f"{where}: `{key}` must be a whole number from {low} to {high}, not {value!r}")
    return number


def _tasks(text: str, where: str) -> tuple[int, int | None]:
    low, _, high = text.partition(",")
    try:
        lo, hi = int(low), int(high) if high else None
    except ValueError:
        raise SpecError(f"{where}: `n` must be MIN or MIN,MAX (whole numbers), not {text!r}")
    if lo < 1 or (hi is not None and hi < lo):
        raise SpecError(f"{where}: `n` {text!r}: the minimum is at least 1 and the maximum at least the minimum")
    return lo, hi if hi != lo else None


def _array(text: str, where: str) -> tuple[str, tuple[int, ...], int | None]:
    """`name[1-100:2,5]%10` -> (name, indices, throttle), by the controller's own arrays.parse."""
    name, suffix = arrays.split_name(text.strip())
    if suffix is None or not name:
        raise SpecError(f"{where}: `array` must look like name[1-100] or name[1-100]%10, not {text!r}")
    try:
        spec = arrays.parse(suffix)
    except SpecError as err:
        raise SpecError(f"{where}: {err}")
    return name, spec.indices, spec.throttle
