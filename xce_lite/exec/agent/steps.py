"""The commands a supervised systemd unit runs, each a fresh interpreter: `exec UNIT_DIR` (its main
process: the supervisor), `pre UNIT_DIR` (its ExecStartPre: the pre hooks) and `post UNIT_DIR`
(its ExecStopPost, which systemd runs however the unit ended: THE result, fdatasync'ed).

These load only the modules they need (not the server, D-Bus or probe ones): one interpreter
start per unit.
"""

from __future__ import annotations

import os
import sys
import time

from .hooks import hook_failure, run_hooks, with_hooks
from .journal import JOURNAL, append_shared, journal_kill_reason, record
from .jsonl import dumps
from .recorders import DirRecorder, UnitRecorder, oom_kills
from .signals import SUPERVISOR_SIGNALS, signal
from .supervisor import become_supervisor
from .runas import remove_unit_dir
from .util import boot_id, format_limit, format_size, make_result, poke, read_json, write_file


def exec_main(unit_dir: str) -> int:
    """`exec UNIT_DIR`: supervise the unit that UNIT_DIR/spec.json describes, in this process (the
    main process of a systemd unit). With a spool in the spec (the agent wrote it), `started` and
    task ends go to the spool's journal and the result to UNIT_DIR/result.json for `post`;
    without one, everything goes to files in UNIT_DIR (DirRecorder)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)  # first: a TERM now is held, not fatal
    spec = read_json(os.path.join(unit_dir, "spec.json"))
    if spec is None:
        print(f"agent exec: no spec.json in {unit_dir}; the agent (or you) writes it", file=sys.stderr)
        return 2
    if spec.get("spool"):
        systemd_memory = spec.get("watch_mem_limit") is False and bool(spec.get("mem_limit"))
        hooks = bool(spec.get("hooks"))
        recorder = UnitRecorder(spec["spool"], spec["unit"], boot_id(), unit_dir, systemd_memory, hooks)
        become_supervisor(recorder, spec, spec["start_time"], detach=False)
    else:
        become_supervisor(DirRecorder(unit_dir), spec, time.time(), detach=False)
    return 0


def pre_main(unit_dir: str) -> int:
    """`pre UNIT_DIR`, the unit's ExecStartPre: run its pre hooks (run_hooks; a stop of the unit
    stops them) and leave their outcomes in UNIT_DIR/hooks.json for `post`; exit 1 if one failed,
    so that systemd does not start the job (and runs the unit's ExecStopPost)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)  # first: a TERM now is held, not fatal
    spec = read_json(os.path.join(unit_dir, "spec.json"))
    if spec is None:
        print(f"agent pre: no spec.json in {unit_dir}; the agent (or you) writes it", file=sys.stderr)
        return 2
    outcomes, failure = run_hooks(spec, "pre")
    write_file(os.path.join(unit_dir, "hooks.json"), dumps(outcomes))
    return 1 if failure else 0


def post_main(unit_dir: str) -> int:
    """`post UNIT_DIR`, the unit's ExecStopPost, which systemd runs however the unit ended: append
    THE finished record (fdatasync'ed), remove UNIT_DIR, poke the agent. Also when the supervisor
    wrote nothing (SIGKILLed by the OOM killer or at the stop timeout, or never started). With
    hooks: the pre hooks' outcomes (one that failed is the reason: the job never ran), then the
    post hooks, run here once the result is known (their env says it), each to its timeout."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)  # a hook's end, and systemd's TERM, wait here
    spec = read_json(os.path.join(unit_dir, "spec.json"))
    if spec is None:
        print(f"agent post: no spec.json in {unit_dir}: nothing to record", file=sys.stderr)
        return 0
    spool, unit = spec["spool"], spec["unit"]
    journal = os.path.join(spool, JOURNAL)
    try:
        supervised = read_json(os.path.join(unit_dir, "result.json"))
    except ValueError:  # torn by a crash of the supervisor in mid-write
        supervised = None
    oom = oom_kills() if spec.get("watch_mem_limit") is False and spec.get("mem_limit") else 0
    result = post_result(spec, supervised, os.environ, oom, lambda: journal_kill_reason(journal, unit))
    if spec.get("hooks"):
        try:
            outcomes = read_json(os.path.join(unit_dir, "hooks.json")) or []
        except ValueError:
            outcomes = []
        failed = [hook_failure(o) for o in outcomes if not o["ok"] and not o["stopped"]]
        if failed and supervised is None:  # a pre hook failed: the job never ran
            result.update(reason=failed[0], exit_code=None, signal=None)
        outcomes += run_hooks(spec, "post", result)[0]
        with_hooks(result, outcomes, spec.get("post_failure"))
    inode, end = append_shared(journal, record("finished", unit=unit, result=result), sync=True)
    remove_unit_dir(unit_dir)
    poke(spool, synced=[inode, end])
    return 0


def post_result(spec: dict, supervised: dict | None, env, oom: int, kill_reason) -> dict:
    """The unit's result: the supervisor's (None if it wrote none) merged with what systemd says
    ($SERVICE_RESULT, $EXIT_CODE, $EXIT_STATUS), `oom` (OOM kills counted in the unit's memory
    cgroup) and `kill_reason()` (the kill requested, if any), worded as the plain supervisor words
    its reasons. systemd is the authority on why it stopped the unit; the supervisor on the job."""
    service = env.get("SERVICE_RESULT") or None
    result = dict(supervised) if supervised else make_result(spec["start_time"], None)
    reason = result.get("reason")
    run_limit, mem_limit = spec.get("run_limit"), spec.get("mem_limit")
    # observed: systemd 252 on cgroup v1 reports a MemoryMax kill as `signal` (or as the job's own
    # end, when the kernel picked a process other than the supervisor): the OOM counter tells
    if mem_limit and (oom > 0 or service == "oom-kill"):
        reason = f"memory limit {format_size(mem_limit)} exceeded"
    elif (service == "timeout" and run_limit) or supervised is None:
        kill = (kill_reason() or "").strip()
        status, how = env.get("EXIT_STATUS", ""), env.get("EXIT_CODE", "")
        if kill:
            reason = reason if supervised else kill  # a supervisor words a requested kill itself
        elif service == "timeout" and run_limit:
            reason = f"run limit {format_limit(run_limit)} reached"
        elif how == "exited" and status.isdigit() and 200 <= int(status) < 250:
            reason = (
                f"exec failed: systemd could not start the supervisor (status {status}); "
                f"see journalctl -u {spec['unit']}"
            )
        else:
            reason = (
                f"supervisor lost: it ended without a result ({service}: {how} {status}), so the job's "
                f"exit status is unknown; see journalctl -u {spec['unit']}"
            )
    result.update(reason=reason, service_result=service, mode=spec.get("mode"))
    return result
