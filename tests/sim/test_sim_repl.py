"""The real `xce sim repl` (the controller's own tick): a stdin script in, the transcript out, for
every command; tracing never changes a recording, a snapshot, a verify result or what `info` prints
besides the trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import paths

EXAMPLE = paths.EXAMPLES / "sim" / "gpu"


def repl(script: str, *options: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xce_lite", "sim", "repl", str(EXAMPLE / "xce.yaml"),
                           str(EXAMPLE / "workload.yaml"), *options], input=script, capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def test_help_steps_breakpoints_info_and_quit(tmp_path):
    out = repl("help\nbreak at 600\nbreak dispatch 9\nbreak pending 100 7\ninfo breaks\nstep 3\ncontinue\n"
               "info jobs\ndelete 3\nstep\ninfo job 7\ninfo hosts\ncontinue\ninfo job 9\ndelete all\ncontinue\n"
               "info summary\nstep\nquit\nstep\n")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Trace:\n  trace on [all | JOB...] [summary|full] [file PATH]" in text
    assert "3: when job 7 has been pending longer than 100 s" in text
    # the controller's tick: a launch is recorded RUN at the next tick, which is an instant of its own
    assert "step 2 t=1: nothing new; 0 pending, 2 running" in text
    assert "step 3 t=10 session 2: submitted 6; dispatched 3 on gpu1*1, 4 on gpu2*1; 4 pending, 4 running" in text
    assert "  pend [7 8]: array 3 runs at most 4 elements at once (%4); it waits for one to end" in text
    assert "breakpoint 3 (when job 7 has been pending longer than 100 s) hit at step 6 t=20" not in text
    assert "breakpoint 3 (when job 7 has been pending longer than 100 s) hit at step 8 t=610" in text
    assert "step 8 t=610: 0 submitted, 2 finished, 2 dispatched; 4 pending, 4 running" in text  # a rollup line
    assert "     7 sweep[5]       PEND" in text and "     5 sweep[3]       DISP     gpu      bob      gpu1*1" in text
    # the elements that ended at 610 counted against the throttle in that tick; at the next, 7 is fed
    assert "step 9 t=611 session 6: nothing new; 4 pending, 4 running\n  pend [7 8]: 2 hosts: gpus needed 1" in text
    assert "why it waits: 2 hosts: gpus needed 1, free at most 0" in text
    assert "gpu1             2  gpus 0/4" in text
    assert "breakpoint 2 (on the dispatch of job 9) hit at step 21 t=3601" in text
    assert "     9 eval           DISP     gpu      ann      gpu1*1               submit 20" in text
    assert "  workload row 4: -n 1 -R rusage[gpus=4] runtime 300 s exit 0 after done(train1)" in text
    assert "the simulation is over at t=3901 (step 23)" in text and "jobs: 10 DONE" in text
    assert text.rstrip().endswith("(xce-sim) quit")  # nothing after quit is read


def test_eof_ends_like_quit_and_errors_say_what_to_do():
    out = repl("frobnicate\nstep x\nbreak at\ninfo job 99\ntrace on 99\n")
    assert out.returncode == 1
    for expected in ("error: unknown command 'frobnicate'; `help` lists the commands",
                     "error: usage: step [N], N a whole number of 1 or more", "error: usage: break at TIME",
                     "error: '99' is not a job: give an id from 1 to 10"):
        assert expected in out.stdout


def _traced_run(tmp_path: Path, trace_commands: str, mode: str) -> dict[str, bytes]:
    folder = tmp_path / f"run{abs(hash((trace_commands, mode)))}"
    folder.mkdir()
    go = "step 4\nstep 3\ncontinue\n" if mode == "step" else "continue\n"
    script = (f"set output rec.jsonl\n{trace_commands}\nbreak at 610\n{go}snapshot save mid.snap\ninfo jobs\n"
              f"info hosts\ncontinue\ninfo summary\nquit\n")
    out = repl(script, cwd=folder)
    assert out.returncode == 0, out.stdout + out.stderr
    verify = subprocess.run([sys.executable, "-m", "xce_lite", "sim", "run", str(EXAMPLE / "xce.yaml"),
                             str(EXAMPLE / "workload.yaml"), "--verify", "rec.jsonl"], cwd=folder,
                            capture_output=True, text=True, timeout=120)
    untraced = [line for line in out.stdout.splitlines()
                if not line.startswith(("trace ", "  ", "(xce-sim) trace", "tracing", "step "))]
    return {"recording": (folder / "rec.jsonl").read_bytes(), "snapshot": (folder / "mid.snap").read_bytes(),
            "verify": verify.stdout.encode() + bytes([verify.returncode]), "info": "\n".join(untraced).encode(),
            "traced": str("trace step" in out.stdout).encode()}


@pytest.mark.parametrize("mode", ["step", "continue"])
def test_tracing_never_changes_recordings_snapshots_verify_or_accounting(tmp_path, mode):
    base = _traced_run(tmp_path, "trace off", mode)
    assert base["traced"] == b"False" and b"no difference" in base["verify"]
    for commands in ("trace on all summary", "trace on all full", "trace on 3 7 9 full", "trace on 5 summary"):
        got = _traced_run(tmp_path, commands, mode)
        assert got["traced"] == b"True", commands
        for key in ("recording", "snapshot", "verify", "info"):
            assert got[key] == base[key], f"{commands} in {mode} mode changed the {key}"


def test_trace_shows_the_rules_the_plan_and_the_known_unsatisfiable_skip(tmp_path):
    out = repl("trace on 5 6 full\nstep 3\ninfo trace 6\ntrace off 5\ntrace on 7 summary\nstep 6\ntrace off\n"
               "step\ninfo trace\n")
    text = out.stdout
    assert "trace step 3 t=10 session 2 job 5: -n 1, rusage[gpus=1]\n  candidates: 2 hosts, 0 with room, 2 rejected\n" \
           "    gpu1: resource short: gpus needed 1, free 0\n    gpu2: resource short: gpus needed 1, free 0\n" \
           "  pend reason: 2 hosts: gpus needed 1, free at most 0" in text
    assert "trace step 3 t=10 session 2 job 6: -n 1, rusage[gpus=1]\n  no plan generated: skipped, same request " \
           "as job 5 proved unsatisfiable earlier this session\n  pend reason: 2 hosts: gpus needed 1" in text
    assert "trace step 9 t=611 session 6 job 7: pends: 2 hosts: gpus needed 1, free at most 0" in text
    assert "tracing is off" in text
    assert "records shown; 3 stored in" in text and "0 evicted" in text


def test_trace_files_append_refuse_the_recording_and_the_log_and_close_on_quit(tmp_path):
    (tmp_path / "t.txt").write_text("before\n")
    out = repl("set output rec.jsonl\ntrace on all full file t.txt\nstep 3\ntrace on 5 file rec.jsonl\n"
               "trace on 5 file sched.log\ntrace on 5 file missing/dir/x.txt\nset output t.txt\ntrace on 5 full\n"
               "step 3\nquit\n", "--log", "sched.log", cwd=tmp_path)
    text = out.stdout
    assert "error: rec.jsonl is the recording output; give the trace another file" in text
    assert "error: sched.log is the scheduler log; give the trace another file" in text
    assert "error: [Errno 2] No such file or directory: 'missing/dir/x.txt'" in text
    assert "error: t.txt is an open trace file; record to another file" in text
    written = (tmp_path / "t.txt").read_text()
    assert written.startswith("before\ntrace step 1 t=0 session 1 job 1:")
    traced = [line for line in text.splitlines() if line.startswith(("trace step", "  "))]
    assert written.count("trace step") == 6  # steps 1 and 3 (step 2 ran no session)
    assert not any(f"trace step {n} " in written for n in (4, 5, 6))  # closed by `trace on 5 full`
    assert all(line in text for line in written.splitlines()[1:])  # the same bytes as on the console
    assert (tmp_path / "sched.log").read_text().count("\n") == 6 and traced
    assert "tracing jobs 5 at full level" in text


def test_a_snapshot_loaded_in_the_repl_goes_on_as_the_run_it_was_saved_from(tmp_path):
    out = repl("break at 600\ncontinue\nsnapshot save mid.snap\ncontinue\ninfo summary\nsnapshot load mid.snap\n"
               "info jobs\ncontinue\ninfo summary\nsnapshot load nothing.snap\nquit\n", cwd=tmp_path)
    text = out.stdout
    assert "saved the state at step 8 t=610 to mid.snap" in text and "loaded the state at step 8 t=610" in text
    first, second = text.split("(xce-sim) snapshot load mid.snap")
    def after_break(part: str) -> list[str]:
        tail = part.split("(xce-sim) continue\n")[-1]
        return [line for line in tail.splitlines() if not line.startswith("(xce-sim)")]
    assert after_break(first) == after_break(second.split("(xce-sim) snapshot load nothing.snap")[0])
    assert "     7 sweep[5]       PEND" in second  # the state as saved, before it went on
    assert "error: snapshot nothing.snap: cannot read it" in text


def test_the_repl_shows_a_host_loss_requeue_and_retry_and_a_snapshot_taken_then_goes_on_the_same(tmp_path):
    """examples/sim/lossy: n1 is cut off at 200 and declared lost at 320 (its jobs requeued), flaky is
    retried; a snapshot saved just after the loss goes on as the run it was saved from."""
    lossy = paths.EXAMPLES / "sim" / "lossy"
    out = subprocess.run([sys.executable, "-m", "xce_lite", "sim", "repl", str(lossy / "xce.yaml"),
                          str(lossy / "workload.yaml")], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         input="break at 319\ncontinue\nstep 2\ninfo hosts\ninfo job 2\nsnapshot save mid.snap\n"
                               "continue\ninfo summary\nsnapshot load mid.snap\ninfo job 2\ncontinue\ninfo summary\n")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert ("step 128 t=320 session 7: requeued 2, 3; 3 pending, 0 running\n"
            "  requeued 2: host n1 lost: no agent for 0:02:00\n  requeued 3: host n1 lost: no agent for 0:02:00\n"
            "step 129 t=321 session 8: dispatched 1 on n2*1 (attempt 2); 2 pending, 1 running\n") in text
    assert "n1               0  mem 4G/4G, slots 0/2  (unreachable)" in text
    assert "     2 wide           PEND" in text and "why it waits: needs at least 2 tasks, at most 1 fit; n1: " \
                                                    "unreachable" in text
    assert "saved the state at step 129 t=321 to mid.snap" in text and "loaded the state at step 129 t=321" in text
    first, second = text.split("(xce-sim) snapshot load mid.snap")
    def after(part: str) -> list[str]:
        return [line for line in part.split("(xce-sim) continue\n")[-1].splitlines() if not line.startswith("(xce")]
    assert after(first) == after(second) and "step 133 t=600: 0 submitted, 0 finished, 1 dispatched" in second
    assert "retried: 3 job(s) ran more than once" in second and "jobs: 1 EXIT, 3 DONE" in second
