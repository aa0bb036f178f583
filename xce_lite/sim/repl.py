"""The simulator's REPL: step through the controller's decisions, stop where it matters, trace jobs.

Commands are read one a line (stdin or a script); what they print goes to `out`. See HELP for the
commands. The contract the tests hold it to:

- `step [N]` echoes every step in full; `continue` prints one rollup line per round and a traced
  round reports on its own (its full echo and its trace), and stops at a breakpoint or the end.
- A breakpoint stops after the step that meets it: at a time, on a job's dispatch, or when a
  job (or any job) has been pending longer than T seconds.
- Tracing only reads: recordings (`set output`), snapshots and everything `info` prints but the
  trace are the same bytes with tracing off, on for all, on for some, at either level.
- `trace ... file PATH` opens PATH for appending when the command is given; a path that cannot be
  opened, or is the recording output or the scheduler log (same device and inode), is refused and
  the settings stay as they were. A file closes when no setting holds it; `quit` and EOF flush and
  close every file.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from xce_lite.errors import SpecError
from xce_lite.sim import report, trace
from xce_lite.sim.batch import head_of, load_state, save_snapshot
from xce_lite.sim.record import Recorder
from xce_lite.sim.ticked import Step, TickSimulation
from xce_lite.sim.trace import TraceFiles, TraceSettings, TraceStore

HELP = """commands:
  step [N]                 run N steps (1), each echoed in full
  continue                 run to a breakpoint or the end, one rollup line per round
  break at TIME            stop once the clock reaches TIME seconds
  break dispatch JOB       stop when JOB is dispatched
  break pending T [JOB]    stop when JOB (or any job) has been pending longer than T seconds
  delete N|all             remove breakpoint N (see `info breaks`), or all of them
  info jobs|hosts|job ID|trace [JOB]|breaks|summary
  set output PATH          record every following step to PATH (`xce sim run --verify` reads it)
  snapshot save PATH       save the simulated state; `snapshot load PATH` takes it up again
  help                     this text
  quit                     flush and close every file, and leave (EOF does the same)

Trace:
  trace on [all | JOB...] [summary|full] [file PATH]
                           trace all jobs or the ones named, at one line (summary, the default) or
                           in full (candidate hosts and the rule that rejected each, the plan, or
                           the job whose identical request proved unsatisfiable this session);
                           with a file, records are appended to it too (same bytes)
  trace off [JOB...]       stop tracing (those jobs)
  info trace [JOB]         the stored trace records (bounded memory: the oldest go first)"""


@dataclass(frozen=True)
class Breakpoint:
    number: int
    kind: str  # "at", "dispatch", "pending"
    value: float
    job: int | None = None

    def describe(self) -> str:
        if self.kind == "at":
            return f"at t={self.value:g}"
        if self.kind == "dispatch":
            return f"on the dispatch of job {self.job}"
        return f"when {'job ' + str(self.job) if self.job else 'any job'} has been pending longer than {self.value:g} s"


class Repl:
    def __init__(self, sim: TickSimulation, out: IO[str], config_hash: str, log_path: str | None = None) -> None:
        self.sim, self.out = sim, out
        self.head = head_of(sim, config_hash)
        self.recorder: Recorder | None = None
        self.output_path: str | None = None
        self.log_path = log_path
        self.log: IO[str] | None = open(log_path, "a", encoding="utf-8") if log_path else None
        self.breaks: list[Breakpoint] = []
        self._break_numbers = 0
        self.settings: TraceSettings | None = None
        self.files = TraceFiles()
        self.store = TraceStore()

    # ---- the loop

    def run(self, lines: Iterable[str]) -> int:
        """Read commands until quit or EOF; 0, or 1 if the last command failed."""
        status = 0
        try:
            for line in lines:
                self.out.write(f"(xce-sim) {line.rstrip()}\n")
                words = shlex.split(line, comments=True) if line.strip() else []
                if not words:
                    continue
                if words[0] in ("quit", "exit", "q"):
                    break
                try:
                    self.command(words)
                    status = 0
                except (SpecError, ValueError, OSError) as err:
                    self.out.write(f"error: {err}\n")
                    status = 1
        finally:
            self.shutdown()
        return status

    def shutdown(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self.files.close_all()
        if self.log is not None:
            self.log.close()
            self.log = None
        self.settings = None
        self.out.flush()

    def command(self, words: list[str]) -> None:
        verb, args = words[0], words[1:]
        handler = {"step": self.do_step, "s": self.do_step, "continue": self.do_continue, "c": self.do_continue,
                   "break": self.do_break, "delete": self.do_delete, "info": self.do_info, "trace": self.do_trace,
                   "set": self.do_set, "snapshot": self.do_snapshot, "help": self.do_help}.get(verb)
        if handler is None:
            raise ValueError(f"unknown command {verb!r}; `help` lists the commands")
        handler(args)

    # ---- running

    def do_step(self, args: list[str]) -> None:
        count = _count(args)
        for _ in range(count):
            step = self._one()
            if step is None:
                return
            self._echo(step)
            self._emit_trace(step)
            if self._hit(step):
                return

    def do_continue(self, args: list[str]) -> None:
        if args:
            raise ValueError("continue takes no arguments")
        while True:
            step = self._one()
            if step is None:
                return
            if step.examined:  # a traced round reports on its own
                self._echo(step)
                self._emit_trace(step)
            else:
                self.out.write(self._rollup(step) + "\n")
            if self._hit(step):
                return

    def _one(self) -> Step | None:
        step = self.sim.step(self.settings.wants if self.settings else None)
        if step is None:
            self.out.write(f"the simulation is over at t={self.sim.now:g} (step {self.sim.steps}); "
                           f"`info summary` sums it up\n")
            return None
        if self.recorder is not None:
            self.recorder.write(step.to_json())
        if self.log is not None:
            self.log.write(self._rollup(step) + "\n")
        return step

    def _echo(self, step: Step) -> None:
        parts = []
        if step.submitted or step.rejected:
            rejected = f", rejected {len(step.rejected)}" if step.rejected else ""
            parts.append(f"submitted {len(step.submitted)}{rejected}")
        if step.finished:
            parts.append("finished " + ", ".join(f"{i} {s}" + (f"({c})" if s == "EXIT" else "")
                                                 for i, s, c in step.finished))
        if step.requeued:
            parts.append("requeued " + ", ".join(str(i) for i, _why in step.requeued))
        if step.cancelled:
            parts.append("cancelled " + ", ".join(str(i) for i, _why in step.cancelled))
        if step.dispatched:
            parts.append("dispatched " + ", ".join(f"{j} on " + " ".join(f"{h}*{n}" for h, n in hosts)
                                                   + (f" (attempt {a})" if a > 1 else "")
                                                   for j, a, hosts in step.dispatched))
        session = f" session {step.session}" if step.session else ""
        self.out.write(f"step {step.number} t={step.time:g}{session}: " + ("; ".join(parts) or "nothing new")
                       + f"; {step.pending} pending, {step.running} running\n")
        for row, why in step.rejected:
            self.out.write(f"  rejected workload row {row}: {why}\n")
        for job_id, requeued_why in step.requeued:
            self.out.write(f"  requeued {job_id}: {requeued_why}\n")
        for job_id, cancelled_why in step.cancelled:
            self.out.write(f"  cancelled {job_id}: {cancelled_why}\n")
        for reason, ids in step.reasons:
            self.out.write(f"  pend [{' '.join(map(str, ids))}]: {reason}\n")

    def _rollup(self, step: Step) -> str:
        return (f"step {step.number} t={step.time:g}: {len(step.submitted)} submitted, {len(step.finished)} finished, "
                f"{len(step.dispatched)} dispatched; {step.pending} pending, {step.running} running")

    def _emit_trace(self, step: Step) -> None:
        if not step.examined or self.settings is None:
            return
        for examined in step.examined:
            lines = trace.render(examined, step.number, step.time, step.session, self.settings.level)
            text = "\n".join(lines)
            self.store.add(trace.Record(step.number, examined.job_id, text))
            self.out.write(text + "\n")
            self.files.write(self.settings.file, text + "\n")

    def _hit(self, step: Step) -> bool:
        """Report every breakpoint this step meets; True if any did."""
        dispatched = {j for j, _a, _hosts in step.dispatched}
        hit = [b for b in self.breaks if (b.kind == "at" and step.time >= b.value)
               or (b.kind == "dispatch" and b.job in dispatched) or (b.kind == "pending" and self._pending_longer(b))]
        for b in hit:
            self.out.write(f"breakpoint {b.number} ({b.describe()}) hit at step {step.number} t={step.time:g}\n")
            if b.kind == "at":  # a time is passed once
                self.breaks.remove(b)
        return bool(hit)

    def _pending_longer(self, b: Breakpoint) -> bool:
        now = self.sim.now
        jobs = self.sim.outcomes([b.job]) if b.job else self.sim.outcomes(include_finished=False)
        return any(j.state == "PEND" and now - j.submit > b.value for j in jobs)

    # ---- breakpoints, info, settings

    def do_break(self, args: list[str]) -> None:
        usage = "break at TIME | break dispatch JOB | break pending T [JOB]"
        if not args or args[0] not in ("at", "dispatch", "pending") or len(args) < 2:
            raise ValueError(f"usage: {usage}")
        kind = args[0]
        if kind == "dispatch":
            b = Breakpoint(self._break_numbers + 1, kind, 0, self._job(args[1]))
        else:
            value = _seconds(args[1])
            b = Breakpoint(self._break_numbers + 1, kind, value, self._job(args[2]) if len(args) > 2 else None)
        self._break_numbers += 1
        self.breaks.append(b)
        self.out.write(f"breakpoint {b.number}: {b.describe()}\n")

    def do_delete(self, args: list[str]) -> None:
        if args == ["all"]:
            self.breaks.clear()
        elif len(args) == 1 and args[0].isdigit() and any(b.number == int(args[0]) for b in self.breaks):
            self.breaks = [b for b in self.breaks if b.number != int(args[0])]
        else:
            raise ValueError("usage: delete N|all, with N from `info breaks`")
        self.out.write("deleted\n")

    def do_info(self, args: list[str]) -> None:
        what = args[0] if args else ""
        if what == "jobs":
            text = report.jobs_table(self.sim)
        elif what == "hosts":
            text = report.hosts_table(self.sim)
        elif what == "job" and len(args) == 2:
            text = report.job_detail(self.sim, self._job(args[1]))
        elif what == "trace":
            job = self._job(args[1]) if len(args) > 1 else None
            records = self.store.of(job)
            text = "\n".join([r.text for r in records] + [
                f"{len(records)} trace records shown; {len(self.store.records)} stored in {self.store.bytes} bytes, "
                f"{self.store.evicted} evicted (bound {self.store.byte_bound} bytes)"])
        elif what == "breaks":
            text = "\n".join(f"{b.number}: {b.describe()}" for b in self.breaks) or "no breakpoints"
        elif what == "summary":
            text = report.summary(self.sim)
        else:
            raise ValueError("usage: info jobs | info hosts | info job ID | info trace [JOB] | info breaks | "
                             "info summary")
        self.out.write(text + "\n")

    def do_trace(self, args: list[str]) -> None:
        if not args or args[0] not in ("on", "off"):
            raise ValueError("usage: trace on [all | JOB...] [summary|full] [file PATH], or trace off [JOB...]")
        if args[0] == "off":
            dropped = frozenset(self._job(a) for a in args[1:])
            old = self.settings
            if not dropped or old is None or old.jobs is None:
                self.settings = None if not dropped or old is None else old  # `trace off 5` under `all`: keep all
            else:
                left = old.jobs - dropped
                self.settings = TraceSettings(left, old.level, old.file) if left else None
            if old is not None and (self.settings is None or self.settings.file != old.file):
                self.files.release(old.file)
            self.out.write(self._describe_trace() + "\n")
            return
        jobs: frozenset[int] | None = frozenset()
        level, path, rest = trace.SUMMARY, None, args[1:]
        while rest:
            word = rest.pop(0)
            if word == "all":
                jobs = None
            elif word in (trace.SUMMARY, trace.FULL):
                level = word
            elif word == "file":
                if not rest:
                    raise ValueError("trace ... file PATH: name the file")
                path = rest.pop(0)
            else:
                jobs = (jobs or frozenset()) | {self._job(word)} if jobs is not None else None
        if jobs == frozenset():
            jobs = None
        key = None
        if path is not None:  # acquired before anything changes: a refusal leaves the settings as they were
            key = self.files.acquire(path, self._forbidden())
        old = self.settings
        self.settings = TraceSettings(jobs, level, key)
        if old is not None:
            self.files.release(old.file)
        self.out.write(self._describe_trace() + "\n")

    def _describe_trace(self) -> str:
        s = self.settings
        if s is None:
            return "tracing is off"
        who = "all jobs" if s.jobs is None else "jobs " + " ".join(map(str, sorted(s.jobs)))
        return f"tracing {who} at {s.level} level" + (", also to a file" if s.file else "")

    def _forbidden(self) -> dict[str, tuple[int, int]]:
        found = {}
        for label, path in (("recording output", self.output_path), ("scheduler log", self.log_path)):
            if path is not None:
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                found[label] = (st.st_dev, st.st_ino)
        return found

    def do_set(self, args: list[str]) -> None:
        if len(args) != 2 or args[0] != "output":
            raise ValueError("usage: set output PATH")
        path = args[1]
        if self.files.is_open(path):
            raise ValueError(f"{path} is an open trace file; record to another file")
        out = open(path, "w", encoding="utf-8")  # the recorder holds it
        if self.recorder is not None:
            self.recorder.close()
        self.recorder = Recorder(out, {**self.head, "first_step": self.sim.steps + 1})
        self.output_path = path
        self.out.write(f"recording from step {self.sim.steps + 1} to {path}\n")

    def do_snapshot(self, args: list[str]) -> None:
        if len(args) != 2 or args[0] not in ("save", "load"):
            raise ValueError("usage: snapshot save PATH | snapshot load PATH")
        path = Path(args[1])
        if args[0] == "save":
            save_snapshot(self.sim, self.head, path)
            self.out.write(f"saved the state at step {self.sim.steps} t={self.sim.now:g} to {path}\n")
            return
        self.sim = load_snapshot(path, self.sim, self.head)
        self.out.write(f"loaded the state at step {self.sim.steps} t={self.sim.now:g} from {path}\n")

    def do_help(self, args: list[str]) -> None:
        self.out.write(HELP + "\n")

    def _job(self, text: str) -> int:
        if not text.isdigit() or not 1 <= int(text) <= self.sim.job_count:
            raise ValueError(f"{text!r} is not a job: give an id from 1 to {self.sim.job_count}")
        return int(text)


def load_snapshot(path: Path, sim: TickSimulation, head: dict) -> TickSimulation:
    """A new simulation of `sim`'s config and workload in the state saved at `path` (replayed to it);
    `sim` is closed once the new one stands, and kept if the snapshot cannot be taken up."""
    state = load_state(path, head)
    fresh = TickSimulation(sim.config_path, sim.workload, sim.interval)
    try:
        fresh.restore(state)
    except BaseException:
        fresh.close()
        raise
    sim.close()
    return fresh


def _count(args: list[str]) -> int:
    if not args:
        return 1
    if len(args) == 1 and args[0].isdigit() and int(args[0]) >= 1:
        return int(args[0])
    raise ValueError("usage: step [N], N a whole number of 1 or more")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds")
    if value < 0:
        raise ValueError(f"{text!r}: give 0 or more seconds")
    return value
