"""The Python API, for scripts and notebooks: `from xce_lite import Cluster`.

A `Cluster` talks to a home's controller as the CLI does, through the same REST API on the home's
Unix socket (so it can do what you may do with `xce`, as you, and nothing more). Submit options are
the CLI's (`xce submit`'s), by keyword, built into a job spec by the very code `xce submit` uses;
jobs come back as the dicts `xce jobs --json` prints (schema 1: fields are only ever added).

Errors are the XceError kinds the CLI maps to its exit codes: SpecError (bad input, nothing stored:
exit 2), NotFound (2), ControllerDown (3), TransitionError (a refused action: 1). `wait` raises the
built-in TimeoutError when its timeout runs out (the CLI's exit 124).
"""

from __future__ import annotations

import base64
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from xce_lite import errors
from xce_lite.api.client import Client
from xce_lite.config import presets
from xce_lite.home.paths import Home, resolve_home

# keyword -> the CLI option key it sets (the keywords are the option keys, but for these)
_RENAMED = {"app_params": "app_param"}


def _options(given: dict[str, Any]) -> dict[str, Any]:
    """Keywords as the CLI's option values (what `xce submit` would have parsed)."""
    options: dict[str, Any] = {}
    for key, value in given.items():
        if value is None or value is False or value == () or value == []:
            continue
        key = _RENAMED.get(key, key)
        if key in ("env", "app_param") and isinstance(value, dict):
            value = [f"{k}={v}" for k, v in value.items()]
        elif key == "resreq" and isinstance(value, str):
            value = [value]
        elif key == "tasks" and not isinstance(value, str):
            value = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
        elif key == "run_limit" and isinstance(value, (int, float)):
            value = f"{int(value)}s"  # a number is seconds here (the CLI's bare number is minutes)
        elif key == "mem_limit" and isinstance(value, int):
            value = str(value)  # MB, as `-M 512`
        elif key == "retry_on" and not isinstance(value, str):
            value = ",".join(map(str, value))
        options[key] = list(value) if isinstance(value, tuple) else value
    return options


class Cluster:
    """One cluster home's controller. `Cluster()` is $XCE_HOME's (else ~/.xce); `Cluster("~/lab")`
    another's. Use it in a `with` block, or call `close()`."""

    def __init__(self, home: str | Path | None = None, timeout: float = 60.0):
        self.home: Home = resolve_home(str(Path(home).expanduser()) if home is not None else None).require()
        self._client = Client(self.home.socket, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- submitting ------------------------------------------------------------------------------

    def submit(self, command: str | Sequence[str], *, preset: str | None = None, **options: Any) -> int:
        """Submit `command` (a list of arguments, or a string split as a shell would, never run by
        one) with `xce submit`'s options by keyword: name ("sims[1-10]%2" for an array), queue, project, app,
        tasks (4, (2, 8) or "2,8"), resreq (a string or a list), gpus, stdout, stderr, cwd,
        env ({NAME: VALUE}), env_none, run_limit ("30m", or seconds), mem_limit ("2G", or MB),
        priority, hold, app_params ({NAME: VALUE}), depend, on_dep_fail, retry, retry_on ([1, 75]),
        pre_exec, post_exec; `preset` starts from a saved preset. Returns the job's id (an array's)."""
        from xce_lite.cli.submit import build_spec, expand  # the CLI's own spec building

        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        if not argv:
            raise errors.SpecError("command: give the program to run (and its arguments)")
        unknown = sorted(set(options) - set(presets.OPTIONS) - set(_RENAMED))
        if unknown:
            raise errors.SpecError(f"unknown submit option(s): {', '.join(unknown)}; the options are those of "
                                   f"`xce submit --help`, by keyword: {', '.join(sorted(presets.OPTIONS))}")
        chosen = presets.load(preset) if preset is not None else None
        merged, from_preset = expand(_options(options), chosen)
        try:
            spec = build_spec(merged, argv, chosen, from_preset)
        except click.BadParameter as err:
            hint = err.param_hint if isinstance(err.param_hint, str) else ""  # build_spec names one option
            key = next((k for k, (flag, _t) in presets.OPTIONS.items() if flag == hint), hint)
            keyword = {v: k for k, v in _RENAMED.items()}.get(key, key)
            raise errors.SpecError(f"{keyword} ({hint}): {err.message}") from None
        return self._client.submit({"jobs": [spec]})["ids"][0]  # with a request id: a lost reply is asked again

    def submit_flow(self, file: str | Path, **variables: str) -> dict:
        """Check a flow file whole and submit all its steps, or none (`xce flow submit FILE
        --set K=V`); {"flow", "steps": [{"step", "id", "array"}], ...}."""
        from xce_lite.cli.flow import load_file, submission

        path = Path(file).expanduser()
        loaded = load_file(path, {k: str(v) for k, v in variables.items()})
        return self._client.submit(submission(path, loaded), "/flows")  # a lost reply is asked again

    # ---- looking -------------------------------------------------------------------------------------

    def jobs(self, *ids: int | str, user: str | None = None, finished: bool = False, elements: bool = False,
             details: bool = False) -> list[dict]:
        """Jobs as `xce jobs --json` lists them: yours unfinished by default; `user="all"`, `finished`,
        `elements` (each element of an array), `details` (effective values and history)."""
        reply = self._client.get("/jobs", ids=",".join(map(str, ids)) or None, user=user, all=finished,
                                 elements=elements or None, effective=details or None, history=details or None)
        return reply["jobs"] + [{"array": True, **a} for a in reply["arrays"]]

    def job(self, job_id: int | str) -> dict:
        """One job (or element, "42[7]") with every field, its effective values and its history."""
        found = self._client.get("/jobs", ids=str(job_id), effective=True, history=True)["jobs"]
        if not found:
            raise errors.NotFound(f"{job_id} is an array, not a job: ask for its elements, e.g. {job_id}[1]")
        return found[0]

    def why(self, job_id: int | str) -> dict:
        """Why a pending job waits: {"state", "summary", "lines": [per host], "effective": [...]}."""
        return self._client.get("/jobs/why", id=str(job_id))

    def output(self, job_id: int, stream: str = "out") -> str:
        """The job's output (stream "err": its error file) so far, read on its host."""
        chunks, offset = [], 0
        while True:
            reply = self._client.get("/jobs/peek", id=job_id, offset=offset, stream=stream)
            chunks.append(base64.b64decode(reply["data_b64"]))
            offset = reply["offset"]
            if reply["eof"]:
                return b"".join(chunks).decode("utf-8", errors="replace")

    def hosts(self) -> list[dict]:
        return self._client.get("/hosts")["hosts"]

    def flow(self, name: str) -> dict:
        """Your most recent flow of that name, each step with its state (`xce flow status --json`)."""
        return self._client.get("/flows", name=name)["flow"]

    def flows(self) -> list[dict]:
        """Your flows, most recent first."""
        return self._client.get("/flows/list")["flows"]

    # ---- waiting and acting -------------------------------------------------------------------------

    def wait(self, *ids: int | str, timeout: float | None = None) -> list[dict]:
        """Block until the jobs (arrays: every element) finish; their final records. TimeoutError
        after `timeout` seconds. It does not fail on EXIT: look at each job's `state`. The polls are
        brief (counts); the records are read once, at the end (40,000 of them took the controller
        2.4 s a poll)."""
        if not ids:
            raise errors.SpecError("wait: name at least one job id")
        named = ",".join(map(str, ids))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic()))
            finished = self._client.get("/jobs/wait", ids=named, timeout=left, brief=True)["finished"]
            late = deadline is not None and time.monotonic() >= deadline
            if not (finished or late):
                continue
            reply = self._client.get("/jobs/wait", ids=named, timeout=0)
            if reply["finished"]:
                return reply["jobs"]
            if late:
                running = ", ".join(f"{j.get('display_id') or j['id']} {j['state']}" for j in reply["jobs"]
                                    if j["state"] not in ("DONE", "EXIT"))
                raise TimeoutError(f"not finished after {timeout:g} s: {running}")
            # finished by the brief reply, not by the records: a job was requeued meanwhile; wait on

    def kill(self, *ids: int | str) -> list[str]:
        return self._act("/jobs/kill", ids)

    def hold(self, *ids: int | str) -> list[str]:
        return self._act("/jobs/hold", ids)

    def release(self, *ids: int | str) -> list[str]:
        return self._act("/jobs/release", ids)

    def rescue_flow(self, name: str) -> dict:
        """Submit again what did not end DONE in your flow of that name (`xce flow rescue`)."""
        return self._client.submit({"name": name}, "/flows/rescue")  # with a request id, as submit_flow

    def _act(self, path: str, ids: Sequence[int | str]) -> list[str]:
        """The controller's messages; TransitionError naming each job it refused (the others were
        acted on), as `xce kill` exits 1."""
        if not ids:
            raise errors.SpecError("name at least one job id")
        results = self._client.post(path, {"ids": list(ids)})["results"]
        refused = [r["message"] for r in results if not r["ok"]]
        if refused:
            raise errors.TransitionError("; ".join(refused))
        return [r["message"] for r in results]
