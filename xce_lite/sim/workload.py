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
    array     `name[1-100]%10`: that many elements, at most 10 running at once (`name` is then the
              array's name; the elements are name[1], name[2], ...)

Dependencies and arrays are the controller's own (deps.py, arrays.py, gate.py): see sim/gating.py.

Times are seconds; a string with a unit goes through units.parse_duration, a plain number string
(CSV) is seconds. Bad input raises SpecError naming the file, the job (row) and the field, with
what to write instead; nothing is half-read. `digest` is a hash of the parsed jobs: recordings and
snapshots carry it, so a verify against another workload says so instead of reporting noise.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from xce_lite.errors import SpecError
from xce_lite.quantities import parse_duration, parse_size
from xce_lite.workflow import arrays

FIELDS = ("submit", "user", "queue", "app", "n", "R", "runtime", "exit", "name", "priority", "W", "M", "after",
          "array")
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


@dataclass(frozen=True)
class Workload:
    jobs: tuple[WorkloadJob, ...]
    source: str  # the file, for messages

    @property
    def digest(self) -> str:
        text = json.dumps([asdict(j) for j in self.jobs], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_workload(path: Path) -> Workload:
    """Read a .yaml/.yml or .csv workload; SpecError names the file, row and field of a mistake."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"workload {path}: cannot read it ({err.strerror}); give an existing YAML or CSV file")
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        unknown = sorted(set(rows[0]) - set(FIELDS)) if rows else []
        if unknown:
            raise SpecError(f"workload {path}: unknown column(s) {', '.join(unknown)}; the columns are "
                            f"{', '.join(FIELDS)}")
        rows = [{k: v for k, v in row.items() if v not in (None, "")} for row in rows]
    elif path.suffix.lower() in (".yaml", ".yml"):
        import yaml  # heavy: only here

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise SpecError(f"workload {path}: not valid YAML: {err}")
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
            raise SpecError(f"workload {path}: expected a mapping with `jobs:` a list of jobs")
        rows = data["jobs"]
    else:
        raise SpecError(f"workload {path}: name a .yaml, .yml or .csv file")
    jobs = tuple(parse_job(row, i, str(path)) for i, row in enumerate(rows, 1))
    if not jobs:
        raise SpecError(f"workload {path}: it has no jobs; add at least one")
    return Workload(jobs, str(path))


def parse_job(row: object, index: int, source: str) -> WorkloadJob:
    """One entry; SpecError names `source`, the row and the field."""
    where = f"workload {source}, job {index}"
    if not isinstance(row, dict):
        raise SpecError(f"{where}: expected a mapping of fields ({', '.join(FIELDS)})")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}; the fields are {', '.join(FIELDS)}")
    for required in ("submit", "runtime"):
        if required not in row:
            raise SpecError(f"{where}: `{required}` is missing; give it in seconds")
    slots = max_slots = None
    if "n" in row:
        slots, max_slots = _tasks(str(row["n"]), where)
    array = _array(str(row["array"]), where) if "array" in row else None
    name = _text(row, "name", where)
    if array is not None and name is not None and name != array[0]:
        raise SpecError(f"{where}: name {name!r} and array {array[0]!r} differ; give the array's name once")
    return WorkloadJob(
        row=index, submit=_seconds(row["submit"], "submit", where), runtime=_seconds(row["runtime"], "runtime", where),
        user=_text(row, "user", where) or "user", queue=_text(row, "queue", where),
        app=str(row["app"]) if "app" in row and row["app"] is not None else None,
        slots=slots, max_slots=max_slots, resreq=_resreq(row.get("R"), where),
        exit_code=_int(row.get("exit", 0), "exit", where, 0, 255), name=name if array is None else array[0],
        priority=_int(row.get("priority", 0), "priority", where, 0, 100),
        run_limit=_seconds(row["W"], "W", where) if "W" in row else None,
        mem_limit=_size(row["M"], where) if "M" in row else None,
        after=_text(row, "after", where), array=array)


def _text(row: dict, key: str, where: str) -> str | None:
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
        raise SpecError(f"{where}: `{key}` must be a non-empty text, not {value!r}")
    return str(value).strip()


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
