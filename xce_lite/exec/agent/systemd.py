"""Direct units: the job as its unit's main process, with no Python in the unit; the shell scripts
that are its ExecStart and ExecStopPost, written into SPOOL/bin named by their content; and, for a
unit whose end the agent records itself (no ExecStopPost: `agent_records`), its result from what
systemd says of it (unit_result, the twin of STOP_SCRIPT).

Invariant: a unit's command lines and properties hold only checked paths, names and numbers (see
EXEC_SCRIPT): the job's argv and env travel in a 0600 file in its host directory (ENV_FILE), never
in the unit's Environment=, which any user of the host reads (`systemctl show -p Environment`).
"""

from __future__ import annotations

import os
import time

from .journal import Unit, record
from .signals import SIGNAL_NAMES, signal
from .util import BIN, UNITS, shell_quote, write_file

STOP_MARGIN = 5.0  # seconds systemd waits beyond a unit's grace before it KILLs what is left
ENV_FILE = "job-env.sh"  # in a direct unit's host directory: the job's env and argv, for EXEC_SCRIPT


# A "direct" unit runs the job itself as its main process: ExecStart is /bin/sh on EXEC_SCRIPT, which
# loads the job's env and argv from ENV_FILE and execs it (same pid), and ExecStopPost is /bin/sh on
# STOP_SCRIPT, which appends the unit's finished record. No Python runs in the unit.
# Observed (systemd 252): a daemon-reload re-reads transient units from /run/systemd/transient, where
# the manager wrote their settings back as unit-file text; it writes ExecStartEx= (a key it does not
# read) and escapes '$' and ';' in ways its own parser does not take back, so a command line set
# over D-Bus that holds the job's bytes loses them, or its ExecStopPost, at the next reload. Nor may
# the job's env go in Environment=: that file is world-readable, and so is `systemctl show`. So the
# command lines hold only the checked paths of the scripts, numbers and names, and the job's bytes
# are in ENV_FILE (0600, its directory 0700), single-quoted, which /bin/sh reads back exactly.
EXEC_SCRIPT = r"""# written by the xce host agent: a direct unit's ExecStart (see agent.py). $1 is the job's env
# file (0600): it exports the job's environment and sets its argv. Load it and become the job (the
# same pid).
[ -r "$1" ] || { echo "xce: cannot read the job's environment file $1" >&2; exit 126; }
. "$1"
exec "$@"
"""
STOP_SCRIPT = r"""# written by the xce host agent: a direct unit's ExecStopPost (see agent.py), which systemd runs
# however the unit ended. Writes THE finished record of unit $1, worded as the supervisor words its
# results, to UNITS/$1/finished, which the agent appends to its journal, fdatasync'ed, before anything
# reports it (systemd.STOP_RECORD). Args: UNIT START_TIME MODE RUN_LIMIT MEM_LIMIT BOOT (the boot's
# epoch in 1/100 s); "-" for no limit. Shell builtins only: no exec, no fork.
umask 077
IFS=' '
unit=$1 start=$2 mode=$3 run=$4 mem=$5 boot=$6 dir=@UNITS@/$1
cpu=0 peak=0 oom=0 code=null sig=null reason=null
while IFS=: read -r _ c p; do
  case $p in */"$unit".service) ;; */"$unit".service/.control) p=${p%/.control} ;; *) continue ;; esac
  case ,$c, in
    ,,) g=@V2@$p
      [ -r "$g/cpu.stat" ] && while read -r k v; do [ "$k" = usage_usec ] && cpu=$((v * 1000)); done < "$g/cpu.stat"
      [ -r "$g/memory.peak" ] && read -r peak < "$g/memory.peak"
      [ -r "$g/memory.events" ] && while read -r k v; do [ "$k" = oom_kill ] && oom=$v; done < "$g/memory.events" ;;
    *,cpuacct,*) g=/sys/fs/cgroup/$c$p; [ -r "$g/cpuacct.usage" ] && read -r cpu < "$g/cpuacct.usage" ;;
    *,memory,*) g=/sys/fs/cgroup/memory$p
      [ -r "$g/memory.max_usage_in_bytes" ] && read -r peak < "$g/memory.max_usage_in_bytes"
      [ -r "$g/memory.oom_control" ] && while read -r k v; do [ "$k" = oom_kill ] && oom=$v
      done < "$g/memory.oom_control" ;;
  esac
done < /proc/self/cgroup
read -r st < /proc/self/stat
set -- ${st##*) }
end=$((boot + ${20} * 100 / @HZ@))
status=$EXIT_STATUS
case $EXIT_CODE in
  exited) case $status in ""|*[!0-9]*) ;; *) code=$status ;; esac ;;
  killed|dumped) case $status in @SIGNALS@ RTMIN+*) sig=$((@RTMIN@ + ${status#RTMIN+})) ;; *) sig=0 ;; esac ;;
esac
case $SERVICE_RESULT in ""|*[!a-z-]*) result=null ;; *) result="\"$SERVICE_RESULT\"" ;; esac
journalctl="journalctl -u $unit"
[ "$mode" = user ] && journalctl="journalctl --user -u $unit"
if [ "$mem" != - ] && { [ "$oom" -gt 0 ] || [ "$SERVICE_RESULT" = oom-kill ]; }; then
  reason="\"memory limit $mem exceeded\""
elif [ -r "$dir/kill_reason" ] && read -r r < "$dir/kill_reason" && [ "${r#\"}" != "$r" ]; then
  reason=$r
elif [ "$SERVICE_RESULT" = timeout ] && [ "$run" != - ]; then
  reason="\"run limit $run reached\""
elif [ "$sig" != null ]; then
  reason="\"killed by signal SIG$status\""
  [ -r "$dir/signalled" ] && read -r s r < "$dir/signalled" && [ "$s" = "$status" ] && reason=$r
elif [ -z "$EXIT_CODE" ]; then
  reason="\"the job did not start ($SERVICE_RESULT); see $journalctl\""
elif [ "$code" != null ] && [ "$code" -ge 200 ] && [ "$code" -le 249 ]; then
  reason="\"exit status $code: systemd uses 200-249 for its own failures to start a job; see $journalctl\""
fi
f='{"event":"finished","unit":"%s","result":{"exit_code":%s,"signal":%s,"start_time":%s,"end_time":%d.%02d,'
f=$f'"cpu_time":%d.%09d,"max_rss":%d,"reason":%s,"service_result":%s,"mode":"%s"}}\n'
# No flock and no sync (each was an exec: 1.8 ms of the host's CPU per unit, bench/systemd_units.py):
# the file is the unit's own, and the agent makes the record durable (see STOP_RECORD).
printf "$f" "$unit" "$code" "$sig" "$start" $((end / 100)) $((end % 100)) $((cpu / 1000000000)) \
  $((cpu % 1000000000)) "$peak" "$reason" "$result" "$mode" > "$dir/@RECORD@"
"""
# Where STOP_SCRIPT leaves a unit's finished record: UNITS/UNIT/finished, one line. The agent reads it
# once systemd has removed the unit (or no longer knows it), appends it to its journal with fdatasync
# and only then reports it and removes the directory (state.UnitState.take_records). Why no sync here:
# until the agent has read it the record may be only in the page cache, so an OS crash in that window
# (milliseconds while the agent runs; up to the kernel's writeback, ~30 s, while it is away) loses it
# and the unit is judged lost, as a crash a moment before the job's end would have it. An agent-records
# unit (no ExecStopPost) has the same window, and a longer one: systemd's memory. The agent's own
# fdatasync before a result goes out is what makes a reported result durable.
STOP_RECORD = "finished"


# A unit's properties that unit_result reads (the Service interface's, and ActiveState, SubState).
END_PROPERTIES = ("Result", "ExecMainCode", "ExecMainStatus", "ExecMainExitTimestamp", "CPUUsageNSec")
CLD_EXITED, CLD_KILLED, CLD_DUMPED = 1, 2, 3  # ExecMainCode: how the main process ended (waitid's)
NO_VALUE = (1 << 64) - 1  # what systemd says of a number it does not have (CPUUsageNSec)


def unit_over(active: str, sub: str, props: dict) -> bool:
    """Whether a unit that records no result of its own (RemainAfterExit=yes, CollectMode=inactive:
    manager.unit_properties) is over: failed, or its main process has exited and it is exited
    (active), inactive (stopped), or being stopped no more. `props`: unit_result's."""
    if active == "failed":
        return True
    return bool(props.get("ExecMainExitTimestamp")) and (sub == "exited" or active == "inactive")


def unit_result(unit: str, props: dict, start_time: float, mode: str, host_dir: str, limits: tuple) -> dict:
    """The result of a direct unit that has no ExecStopPost, worded as STOP_SCRIPT words it, from
    the unit's properties (`props`: END_PROPERTIES) and the reasons the agent left in its host
    directory (a kill's, a signal's). `limits`: (run limit, memory limit) as formatted, or None.
    systemd keeps no CPU time or peak memory of a unit once its cgroup is gone (252, hybrid: not
    even with CPUAccounting=yes), and it is gone as soon as the unit is over: systemd prunes it on
    entering "exited" as on "failed", so the agent cannot read the files STOP_SCRIPT reads either
    (bench/exited_unit_cgroup.py). cpu_time is CPUUsageNSec where systemd has it, else 0, and
    max_rss 0, unknown."""
    from .jsonl import loads
    from .util import read_text

    how, status, result = props.get("ExecMainCode", 0), props.get("ExecMainStatus", 0), props.get("Result") or None
    code = status if how == CLD_EXITED else None
    sig = status if how in (CLD_KILLED, CLD_DUMPED) else None
    journalctl = f"journalctl {'--user ' if mode == 'user' else ''}-u {unit}"
    run, mem = limits
    reason = None
    kill = read_text(os.path.join(host_dir, "kill_reason"))
    if mem and result == "oom-kill":
        reason = f"memory limit {mem} exceeded"
    elif kill and kill.startswith('"'):
        reason = loads(kill.encode())
    elif result == "timeout" and run:
        reason = f"run limit {run} reached"
    elif sig is not None:
        name = SIGNAL_NAMES.get(sig) or f"SIGRTMIN+{sig - signal.SIGRTMIN}"
        reason = f"killed by signal {name}"
        signalled = (read_text(os.path.join(host_dir, "signalled")) or "").split(" ", 1)
        if len(signalled) == 2 and f"SIG{signalled[0]}" == name:
            reason = loads(signalled[1].encode())
    elif not how:
        reason = f"the job did not start ({result}); see {journalctl}"
    elif code is not None and 200 <= code <= 249:
        reason = f"exit status {code}: systemd uses 200-249 for its own failures to start a job; see {journalctl}"
    end = props.get("ExecMainExitTimestamp") or 0
    cpu = props.get("CPUUsageNSec", NO_VALUE)
    return {
        "exit_code": code, "signal": sig, "start_time": start_time,
        "end_time": end / 1e6 if end else time.time(),
        "cpu_time": 0.0 if cpu == NO_VALUE else cpu / 1e9, "max_rss": 0,
        "reason": reason, "service_result": result, "mode": mode,
    }


def env_file_text(argv: list[str], env: dict[str, str]) -> bytes:
    """ENV_FILE for EXEC_SCRIPT: `export NAME='VALUE'` per variable, then `set -- 'ARG'...`. Single
    quotes keep every byte but NUL (which neither may hold); names are checked (direct_unfit)."""
    lines = [f"export {name}={shell_quote(value)}\n" for name, value in env.items()]
    lines.append("set --" + "".join(f" {shell_quote(arg)}" for arg in argv) + "\n")
    return "".join(lines).encode("utf-8", "surrogateescape")


def stop_record(host_dir: str, unit: str) -> dict | None:
    """The result STOP_SCRIPT left in the unit's host directory (STOP_RECORD), or None: none there
    (the unit's stop script has not run, or it ended before it wrote: lost), or not a whole record
    of this unit (an OS crash while it wrote: lost too)."""
    from .jsonl import loads
    from .util import read_text

    try:
        text = read_text(os.path.join(host_dir, STOP_RECORD))
    except OSError:
        return None
    if not text or not text.endswith("\n"):
        return None
    try:
        rec = loads(text)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("event") != "finished" or rec.get("unit") != unit:
        return None
    result = rec.get("result")
    return result if isinstance(result, dict) else None


def stop_records(units_dir: str, units: dict[str, Unit], names: list[str]) -> bytes:
    """The finished records (journal lines) that STOP_SCRIPT left for those of `names` that are
    direct units with an ExecStopPost (not agent-recorded) and no result yet."""
    found = []
    for name in names:
        u = units.get(name)
        if u is not None and u.result is None and u.direct is not None and u.direct.get("record") != "agent":
            result = stop_record(os.path.join(units_dir, name), name)
            if result is not None:
                found.append(record("finished", unit=name, result=result))
    return b"".join(found)


def unit_scripts(spool: str, cgroup: str | None) -> tuple[str, str]:
    """Write EXEC_SCRIPT and STOP_SCRIPT (made for this spool and host) into SPOOL/bin, named by
    their content, so that a unit started by an earlier agent keeps its own; their paths."""
    import hashlib

    table = " ".join(f"{name[3:]}) sig={num} ;;" for num, name in sorted(SIGNAL_NAMES.items()))
    v2 = "/sys/fs/cgroup/unified" if cgroup == "hybrid" else "/sys/fs/cgroup"
    stop = STOP_SCRIPT
    for key, value in (("UNITS", os.path.join(spool, UNITS)), ("V2", v2), ("HZ", str(os.sysconf("SC_CLK_TCK"))),
                       ("SIGNALS", table), ("RTMIN", str(signal.SIGRTMIN)), ("RECORD", STOP_RECORD)):
        stop = stop.replace(f"@{key}@", value)
    paths = []
    for kind, text in (("exec", EXEC_SCRIPT), ("stop", stop)):
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        path = os.path.join(spool, BIN, f"unit-{kind}-{digest}.sh")
        if not os.path.exists(path):
            write_file(path, text.encode())
        paths.append(path)
    return paths[0], paths[1]


def boot_epoch_cs() -> int:
    """When this host booted, in 1/100 s since the epoch, from the clock and /proc/uptime: a
    process's start time (in clock ticks since boot) plus this is when it started."""
    with open("/proc/uptime", encoding="ascii") as f:
        uptime = float(f.read().split()[0])
    return round((time.time() - uptime) * 100)
