"""Hooks: the step runner. A unit's hooks of a phase run here in order, each in a process group of
its own, never through a shell, each bounded by its timeout; every outcome reaches the result.
See docs/agent-protocol.md ("Hooks")."""

from __future__ import annotations

import os
import time

from .signals import SUPERVISOR_SIGNALS, is_kill, killpg, signal, signal_name
from .spawn import JobEnded, open_outputs, spawn_job
from .util import LETTERS_DIGITS, shell_quote


# The hooks of a unit run here, in order, each bounded by its own timeout: in plain mode inside the
# supervisor (pre hooks before the job, post hooks after it however it ended); under systemd as the
# unit's own steps, `pre UNIT_DIR` its ExecStartPre and `post UNIT_DIR` its ExecStopPost (so they
# run however the unit ends: a kill, RuntimeMaxSec, an OOM kill, a lost agent). One step for all of
# a phase's hooks rather than one systemd step per hook: systemd gives every step the unit's
# Environment= (the job's), where a profile's hooks must see the profile's env only; a step that
# hits its timeout skips the ExecStopPost steps after it (the other post hooks, the result); and
# each hook's outcome must reach the result, and a post hook's env must say how the job ended.
HOOK_POINTS = ("pre_host_exec", "pre_job_exec", "post_job_exec", "post_host_exec")
HOOK_KILL_GRACE = 2.0  # seconds from TERM to KILL for a hook past its timeout, or stopped by a kill
HOOK_PATH = "/usr/local/bin:/usr/bin:/bin"  # a profile hook's PATH when the profile's env sets none
_PLAIN_WORD = frozenset(LETTERS_DIGITS + "/_.,:+=@%-")


def hook_name(hook: dict) -> str:
    return f"{hook['point']} hook ({hook['layer']})"


def hook_failure(outcome: dict) -> str | None:
    """Why a hook failed, worded for a job's reason ("pre_job_exec hook (profile) exited 3"), or None."""
    name = hook_name(outcome)
    if outcome["ok"]:
        return None
    if outcome["error"]:
        return f"{name} could not start: {outcome['error']}"
    if outcome["stopped"]:
        return f"{name} was stopped by a kill"
    if outcome["timed_out"]:
        return f"{name} timed out after {outcome['timeout']:g} s"
    if outcome["signal"]:
        return f"{name} was killed by signal {signal_name(outcome['signal'])}"
    return f"{name} exited {outcome['exit_code']}"


def job_status(spec: dict, result: dict) -> str:
    """DONE or EXIT as the controller will say ("" for a host unit: its job's end is not known here)."""
    if spec.get("role") == "host":
        return ""
    return "DONE" if result["exit_code"] == 0 and result["signal"] is None and result["reason"] is None else "EXIT"


def hook_env(spec: dict, hook: dict, ended: dict | None) -> dict[str, str]:
    """A hook's environment. A profile's: the profile's env, xce's own XCE_* names of the job (job id,
    hosts, host dir, hostfile...) and a PATH; a job's own (-E, -Ep): the job's env. Both get XCE_HOOK
    and XCE_HOOK_LAYER, and post hooks XCE_JOB_STATUS, XCE_JOB_EXIT_CODE, XCE_JOB_SIGNAL and
    XCE_JOB_REASON (empty when there is none)."""
    if hook["layer"] == "job":
        env = dict(spec["env"])
    else:
        env = dict(spec.get("profile_env") or {})
        env.update((k, v) for k, v in spec["env"].items() if k.startswith("XCE_"))
        env.setdefault("PATH", HOOK_PATH)
    env.update(XCE_HOOK=hook["point"], XCE_HOOK_LAYER=hook["layer"])
    if ended is not None:
        env.update(XCE_JOB_STATUS=job_status(spec, ended), XCE_JOB_REASON=ended["reason"] or "",
                   XCE_JOB_EXIT_CODE="" if ended["exit_code"] is None else str(ended["exit_code"]),
                   XCE_JOB_SIGNAL=signal_name(ended["signal"]) if ended["signal"] else "")
    return env


def run_hook(spec: dict, hook: dict, ended: dict | None, stoppable: bool) -> dict:
    """Run one hook to its end, or to its timeout (then TERM, and KILL after HOOK_KILL_GRACE), with
    its output appended to the job's own files after a header line; its outcome. With SUPERVISOR_
    SIGNALS blocked (they are taken here); `stoppable` (pre hooks): a kill stops it, as a timeout does."""
    outcome = {"point": hook["point"], "layer": hook["layer"], "ok": False, "exit_code": None, "signal": None,
               "timed_out": False, "stopped": False, "error": None, "timeout": hook["timeout"], "seconds": 0.0}
    began = time.monotonic()
    try:
        out, err = open_outputs(spec, spec["start_time"])
    except JobEnded as ended_early:
        outcome["error"] = ended_early.result["reason"]
        return outcome
    try:
        words = " ".join(a if a and set(a) <= _PLAIN_WORD else shell_quote(a) for a in hook["argv"])
        os.write(out, f"[xce] {hook_name(hook)} on {os.uname().nodename}: {words}\n".encode("utf-8", "replace"))
        try:
            # a hook runs as the job's user, but one the profile marks `as: root` (an admin's clean-up)
            user = None if hook.get("as") == "root" else spec.get("user")
            pid = spawn_job({"argv": hook["argv"], "env": hook_env(spec, hook, ended), "cwd": spec["cwd"]}, out, err,
                            spec["start_time"], user)
        except JobEnded as failed:
            outcome.update(error=failed.result["reason"], exit_code=failed.result["exit_code"])
            return outcome
        status = wait_hook(pid, hook["timeout"], outcome, stoppable)
        code = os.waitstatus_to_exitcode(status)
        outcome.update(exit_code=None if code < 0 else code, signal=-code if code < 0 else None)
        outcome["ok"] = code == 0 and not outcome["timed_out"] and not outcome["stopped"]
        outcome["seconds"] = round(time.monotonic() - began, 3)
        end = "ok" if outcome["ok"] else (hook_failure(outcome) or "").removeprefix(hook_name(outcome) + " ")
        os.write(out, f"[xce] {hook_name(hook)}: {end} ({outcome['seconds']:.1f} s)\n".encode())
        return outcome
    finally:
        os.close(out)
        if err != out:
            os.close(err)


def wait_hook(pid: int, timeout: float, outcome: dict, stoppable: bool) -> int:
    """Wait for a hook (the leader of its own process group); its wait status. Past its timeout, or
    on a kill when `stoppable`, its group gets TERM, then KILL after HOOK_KILL_GRACE; what is left of
    a hook stopped so is killed once it has ended."""
    deadline, kill_at = time.monotonic() + timeout, None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if outcome["timed_out"] or outcome["stopped"]:
                killpg(pid, signal.SIGKILL)
            return status
        now = time.monotonic()
        if kill_at is None and now >= deadline:
            outcome["timed_out"] = True
            kill_at = now + HOOK_KILL_GRACE
            killpg(pid, signal.SIGTERM)
            killpg(pid, signal.SIGCONT)
        elif kill_at is not None and now >= kill_at:
            killpg(pid, signal.SIGKILL)
            kill_at = now + 3600.0  # KILL is sent; wait for the end
        info = signal.sigtimedwait(SUPERVISOR_SIGNALS, max(0.0, (deadline if kill_at is None else kill_at) - now))
        if info is not None and stoppable and is_kill(info.si_signo) and kill_at is None:
            outcome["stopped"] = True
            kill_at = time.monotonic() + HOOK_KILL_GRACE
            killpg(pid, signal.SIGTERM)
            killpg(pid, signal.SIGCONT)


def run_hooks(spec: dict, phase: str, ended: dict | None = None) -> tuple[list[dict], str | None]:
    """Run the unit's hooks of `phase` ("pre" or "post") in order: (their outcomes, the first
    failure's text or None). Pre hooks stop at the first failure, and a kill stops them; post hooks
    all run, each to its end or its timeout, a kill notwithstanding (they run once the job is over)."""
    outcomes, failure = [], None
    for hook in spec.get("hooks") or ():
        if not hook["point"].startswith(phase + "_"):
            continue
        outcome = run_hook(spec, hook, ended, stoppable=phase == "pre")
        outcomes.append(outcome)
        failure = failure or hook_failure(outcome)
        if phase == "pre" and failure:
            break
    return outcomes, failure


def with_hooks(result: dict, outcomes: list[dict], post_failure: str | None) -> dict:
    """`result` with its hooks' outcomes; post hooks that failed are its note ("post_job_exec hook
    (profile) exited 2"), after the note it had (leftovers killed), or its reason if it has none
    and the profile says post_failure: exit."""
    if not outcomes:
        return result
    result["hooks"] = outcomes
    failed = [text for o in outcomes if o["point"].startswith("post_") and (text := hook_failure(o))]
    if failed and post_failure == "exit" and result["reason"] is None:
        result["reason"] = "; ".join(failed)
    elif failed:
        result["note"] = "; ".join([*([result["note"]] if result.get("note") else []), *failed])
    return result


def hooks_budget(spec: dict, phase: str) -> float:
    """Seconds the hooks of `phase` may take together, each to its timeout and its KILL."""
    return sum(h["timeout"] + HOOK_KILL_GRACE for h in spec.get("hooks") or () if h["point"].startswith(phase + "_"))
