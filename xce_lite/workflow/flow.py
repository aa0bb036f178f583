"""Workflow files: a pipeline of named steps in one YAML document, checked whole before anything runs.

Pure: the decoded document in, a `Flow` out (the CLI reads the file and builds each step's job
spec; the controller submits them all in one transaction; the simulator may plan from it too).

    name: pipeline                      # `xce flow status pipeline`
    vars: {sims: "20", data: input}     # ${sims} anywhere in a string; `--set sims=50` overrides
    defaults: {queue: normal, run_limit: 10m}       # every step's options start from these
    steps:
      prepare:
        command: [python3, prepare.py, "${data}"]  # a list, or one string split like a shell would
      simulate:
        command: python3 simulate.py
        array: "1-${sims}%5"            # an array step: XCE_ARRAY_INDEX, %I in output paths
        after: [prepare]                # = done(prepare)
        retry: 2
      collect:
        command: python3 collect.py
        depend: "numdone(simulate, >= 18) && ended(simulate)"   # a full -w condition on step names
        on_dep_fail: pend

A step's other keys are `xce submit`'s options by their long names, values as typed on the command
line (presets.OPTIONS: tasks "2,4", resreq, run_limit "30m", env ["K=V"], ...); `name` is the step's.
In `depend`, a name is a step of this flow (wildcards match step names) and a number is an existing
job. The graph is checked before anything is submitted: every problem (unknown step or option, a
cycle, a bad value, an unknown queue, an undefined ${var}) is reported at once, with where it is
(`steps.collect.after`), and nothing is submitted. Steps come out in dependency order (then file order), so each step's
upstream steps are submitted before it.
"""

from __future__ import annotations

import fnmatch
import heapq
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xce_lite.config.presets import OPTIONS
from xce_lite.errors import SpecError
from xce_lite.workflow import arrays, deps

STEP_OPTIONS = tuple(k for k in OPTIONS if k != "name")  # the step name is the job name
STEP_KEYS = ("command", "array", "after") + STEP_OPTIONS
FLOW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
STEP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,62}")
MAX_STEPS = 10_000
_VAR = re.compile(r"\$\$|\$\{([^}]*)\}")


@dataclass(frozen=True)
class Step:
    name: str
    command: tuple[str, ...]
    options: dict[str, Any]  # submit options (presets.OPTIONS), with the flow's defaults under them
    array: str | None = None  # "[1-20]%5"
    depend: str | None = None  # the whole condition: `after` edges ANDed with `depend`, on step names
    upstream: tuple[str, ...] = ()  # the steps it names, in order


@dataclass(frozen=True)
class Flow:
    name: str
    steps: tuple[Step, ...]  # upstream steps first

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)


class FlowError(SpecError):
    """Every problem found in a flow document: (where, what) pairs; `where` is a key path."""

    def __init__(self, problems: list[tuple[tuple, str]]):
        self.problems = problems
        super().__init__("\n".join(f"{'.'.join(map(str, loc)) or '(top level)'}: {msg}" for loc, msg in problems))


# `check(option, value)`: what is wrong with one submit option's value (a message), or None. The CLI
# gives one built on `xce submit`'s own parsers and the cluster's queues and profiles; this module
# stays pure.
Check = Callable[[str, Any], "str | None"]


def load(data: Any, sets: dict[str, str] | None = None, check: Check | None = None) -> Flow:
    """The flow `data` (a decoded YAML document) describes, with `sets` overriding its vars;
    FlowError listing every problem (each option's value too, with `check`), so that nothing is
    submitted."""
    problems: list[tuple[tuple, str]] = []
    if not isinstance(data, dict):
        raise FlowError([((), "a flow is a mapping with name and steps")])
    for key in sorted(set(data) - {"name", "vars", "defaults", "steps"}, key=str):
        problems.append(((key,), "unknown key; a flow has name, vars, defaults and steps"))
    name = data.get("name")
    if not isinstance(name, str) or not FLOW_NAME.fullmatch(name):
        problems.append((("name",), "the flow needs a name: letters, digits, _ . - (at most 63)"))
    variables = _vars(data.get("vars"), sets or {}, problems)
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        problems.append((("defaults",), "defaults is a mapping of submit options"))
        defaults = {}
    for key in sorted(set(defaults) - set(STEP_OPTIONS), key=str):
        problems.append((("defaults", key), f"unknown option; defaults may set {', '.join(STEP_OPTIONS)}"))
    defaults = _options(_expand(defaults, variables, ("defaults",), problems), ("defaults",), problems,
                        allowed=STEP_OPTIONS)
    _check_values(defaults, ("defaults",), check, problems)
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, dict) or not raw_steps:
        problems.append((("steps",), "a flow needs steps: a mapping of step name to its command and options"))
        raise FlowError(problems)
    if len(raw_steps) > MAX_STEPS:
        problems.append((("steps",), f"a flow has at most {MAX_STEPS} steps"))
        raise FlowError(problems)
    names = [str(n) for n in raw_steps]
    steps = {}
    for step_name, raw in raw_steps.items():
        step = _step(str(step_name), raw, names, defaults, variables, problems, check)
        if step is not None:
            steps[step.name] = step
    order = _order(steps, problems)  # a cycle is reported beside every other problem
    if problems:
        raise FlowError(problems)
    assert isinstance(name, str)  # else it was a problem
    return Flow(name, tuple(steps[n] for n in order))


def _vars(declared: Any, sets: dict[str, str], problems: list) -> dict[str, str]:
    if declared is None:
        declared = {}
    if not isinstance(declared, dict) or not all(isinstance(v, (str, int, float)) for v in declared.values()):
        problems.append((("vars",), "vars maps names to text or numbers"))
        declared = {}
    values = {str(k): str(v) for k, v in declared.items()}
    for key, value in sets.items():
        if key not in values:
            problems.append((("vars",), f"--set {key}={value}: the flow declares no var {key} "
                                        f"(it declares: {', '.join(values) or 'none'})"))
        values[key] = value
    return values


def _expand(value: Any, variables: dict[str, str], loc: tuple, problems: list) -> Any:
    """${name} replaced in every string (`$$` is a dollar sign)."""
    if isinstance(value, str):
        def one(match: re.Match) -> str:
            if match[0] == "$$":
                return "$"
            if match[1] not in variables:
                problems.append((loc, f"${{{match[1]}}} is not defined: declare it under vars (or --set it)"))
                return match[0]
            return variables[match[1]]
        return _VAR.sub(one, value)
    if isinstance(value, list):
        return [_expand(v, variables, loc + (i,), problems) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _expand(v, variables, loc + (k,), problems) for k, v in value.items()}
    return value


def _options(raw: dict, loc: tuple, problems: list, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The submit options of `raw`, each checked for its type (a string where -R takes several is
    one requirement; numbers are accepted where the command line takes text)."""
    options = {}
    for key, value in raw.items():
        if key not in allowed:
            continue
        kind = OPTIONS[key][1]
        if kind is list and isinstance(value, str):
            value = [value]
        elif kind is list and isinstance(value, dict):
            value = [f"{k}={v}" for k, v in value.items()]  # env: {K: V} as the command line's K=V
        elif kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append((loc + (key,), f"{key} is a list of text ({OPTIONS[key][0]})"))
        elif kind is not list and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            problems.append((loc + (key,), f"{key} must be {kind.__name__} ({OPTIONS[key][0]})"))
        else:
            options[key] = value
    return options


def _check_values(options: dict[str, Any], loc: tuple, check: Check | None, problems: list) -> None:
    for key, value in options.items():
        message = check(key, value) if check is not None else None
        if message:
            problems.append((loc + (key,), message))


def _with_vars(message: str, original: Any, variables: dict[str, str]) -> str:
    """A message about a value that vars made: what it was written as, and the vars' values."""
    used = [m for m in _VAR.findall(original) if m] if isinstance(original, str) else []
    if not used:
        return message
    values = ", ".join(f"{v}={variables[v]}" for v in dict.fromkeys(used) if v in variables)
    return f"{message} (written {original!r}, with {values})"


def _step(name: str, raw: Any, names: list[str], defaults: dict, variables: dict, problems: list,
          check: Check | None = None) -> Step | None:
    loc = ("steps", name)
    if not STEP_NAME.fullmatch(name):
        problems.append((loc, "a step name starts with a letter, then letters, digits, _ . - (at most 63)"))
    if not isinstance(raw, dict):
        problems.append((loc, "a step is a mapping with at least a command"))
        return None
    for key in sorted(set(raw) - set(STEP_KEYS), key=str):
        hint = " (the step's name is its job name)" if key == "name" else ""
        problems.append((loc + (key,), f"unknown step key{hint}; a step has {', '.join(STEP_KEYS)}"))
    original, raw = raw, _expand(raw, variables, loc, problems)
    command = raw.get("command")
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError as err:
            problems.append((loc + ("command",), f"cannot split the command: {err}"))
            command = None
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        problems.append((loc + ("command",), "command is required: a list of words, or one string"))
        command = ["?"]
    own = _options(raw, loc, problems, STEP_OPTIONS)
    _check_values(own, loc, check, problems)
    options = {**defaults, **own}
    array = raw.get("array")
    if array is not None:
        try:
            array = arrays.parse(str(array)).text()
        except SpecError as err:
            problems.append((loc + ("array",), _with_vars(str(err), original.get("array"), variables)))
    after = raw.get("after") or []
    if isinstance(after, str):
        after = [after]
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        problems.append((loc + ("after",), "after is a list of step names"))
        after = []
    for upstream in after:
        if upstream not in names:
            problems.append((loc + ("after",), f"unknown step {upstream!r}; the steps are: {', '.join(names)}"))
    terms = [f"done({a})" for a in after]
    upstream_names = list(dict.fromkeys(after))
    depend = options.pop("depend", None)
    if depend is not None:
        try:
            expr = deps.parse(depend)
            for ref in deps.refs(expr):
                if isinstance(ref, deps.Ref) and ref.name is not None:
                    matched = [n for n in names if fnmatch.fnmatchcase(n, ref.name)]
                    if not matched:
                        problems.append((loc + ("depend",), f"{ref.name!r} names no step of this flow; "
                                                            f"the steps are: {', '.join(names)}"))
                    upstream_names.extend(m for m in matched if m not in upstream_names)
            terms.append(f"({depend})" if terms else depend)
        except SpecError as err:
            problems.append((loc + ("depend",), str(err)))
    return Step(name, tuple(command), options, array, " && ".join(terms) or None, tuple(upstream_names))


def _order(steps: dict[str, Step], problems: list) -> list[str]:
    """Upstream steps first, ties in file order (Kahn's algorithm); a cycle is a problem naming its
    steps in order."""
    position = {name: i for i, name in enumerate(steps)}
    waiting = {name: [u for u in s.upstream if u != name and u in steps] for name, s in steps.items()}
    for name, step in steps.items():
        if name in step.upstream:
            problems.append((("steps", name), f"step {name} depends on itself"))
    downstream: dict[str, list[str]] = {name: [] for name in steps}
    for name, upstream in waiting.items():
        for u in upstream:
            downstream[u].append(name)
    left = {name: len(upstream) for name, upstream in waiting.items()}
    ready = [(position[n], n) for n, count in left.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _pos, name = heapq.heappop(ready)
        order.append(name)
        for d in downstream[name]:
            left[d] -= 1
            if left[d] == 0:
                heapq.heappush(ready, (position[d], d))
    if len(order) < len(steps):
        problems.append((("steps",), "the steps depend on each other in a cycle: " + _cycle(waiting, set(order))))
    return order


def _cycle(waiting: dict[str, list[str]], done: set[str]) -> str:
    """One cycle among the steps not done, as `a -> b -> a`."""
    start = next(n for n in waiting if n not in done)
    path, seen = [start], {start: 0}
    while True:
        nxt = next(u for u in waiting[path[-1]] if u not in done)
        if nxt in seen:
            cycle = path[seen[nxt]:] + [nxt]
            return " -> ".join(reversed(cycle))
        seen[nxt] = len(path)
        path.append(nxt)
