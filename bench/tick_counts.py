"""Counts bench/ticktime.py adds to its table, in the timed controller (as steps with calls only):
sessions the scheduler seam skipped (sched/settled.py: they would have repeated the last answer),
and jobs whose start and end one tick's commit recorded (store/transitions.started_and_finished:
one UPDATE each). Counts, which the machine's load does not move."""

from __future__ import annotations


def count_shortcuts(sched_worker, jobs, stats, lock) -> None:
    real_skips = sched_worker._Shortcut.skips

    def skips(self, pending, base, budget):
        out = real_skips(self, pending, base, budget)
        if out:
            with lock:
                stats["sessions skipped (settled.py)"][0] += 1
        return out

    sched_worker._Shortcut.skips = skips
    real_record = jobs.JobStore.record_tick

    def record_tick(self, w):
        both = {job_id for job_id, _t in w.started} & {f.job_id for f, _e in w.finishes}
        with lock:
            stats["jobs started and ended in one commit"][0] += len(both)
        return real_record(self, w)

    jobs.JobStore.record_tick = record_tick
