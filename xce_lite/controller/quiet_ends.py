"""Ends that do not wake the controller's tick (issue 18): the host events a tick need not follow at once.

Why: each end woke the tick (~1.2 ms of the main thread's CPU, a session, a commit), though with a
chain of queued successors (prefilling.py) the host starts the next job itself and nothing needs
deciding until the chain runs short. So a unit's end, and its queued successor's start (the
host's `unqueued` "started", which travels with it), wait in the event queue for the next tick while,
after the end, at least KEEP jobs stay queued behind the one that starts; the end that leaves fewer
wakes the tick, which collects them all and fills the chain again (one session names a whole chain).
While more jobs pend than wait queued on hosts (a backlog: a refill has jobs to add), the bound is
KEEP_BACKLOG: the refill takes a tick (~2-4 ms from the waking end to the launch on the host), and
with one job left queued a host running short jobs ran dry first (~15% of a 1,000-element array's
starts waited ~3.5 ms for it, bench/README "Session 20"); without a backlog a refill has nothing to
add, and an early tick would only cost CPU (the one-POST stream).

Invariants:
- bounded: a quiet event waits END_WAIT at most. The first one since the tick's last `collect` is
  stamped (`since`, by the controller's clock) and arms a timer (one thread, started at the first
  quiet event, asleep otherwise) that wakes the tick at since + END_WAIT unless a tick took the
  events first; `serve` also sleeps to since + END_WAIT at most. StartWaits' own wait of the same
  ends counts from `since`;
- the link threads decide without the state's lock (`quiet` runs on them; a thread that holds the
  lock may wait on a host's reply those threads deliver): they read `ending` and `starting`, dicts
  the tick replaces whole (`publish`, holding the lock; a reference read is atomic), and `state.waited`
  (one dict lookup). So a quiet decision is the last tick's view: what changed since on another
  thread (a dependant submitted, a job killed) makes a wrong decision cost END_WAIT at most, and no
  decision changes: the session sees the same ends, only later;
- never quiet: ends of jobs anyone waits on (`xce wait`), or while any job has a dependency gate,
  a failed commit is retried, or the clock jumps from event to event (the simulator: Seams.end_waits);
  of multi-unit, ending, killed or withdrawing jobs; a successor's leaving its queue unstarted;
- an end (or a queued successor's start) that comes while a tick runs, between its `taken` and its
  `publish`, and that the last tick's maps do not make quiet, is decided at that `publish`, against
  the maps the tick makes (`deferred`): the tick that runs is usually the one that refills its
  chain (the end of the chain's last queued job woke it; the job that started then is a short
  one), and the old maps do not know the new links yet. Deciding it then delays no tick: a wake
  set while a tick runs takes effect only once it has returned, after its `publish`. A tick that
  returns early publishes too (urgent: every deferred event wakes), and one that fails before its
  `publish` (serve's "tick skipped") calls `abandon`, which wakes for them. Measured: of a
  1,000-element array's waking ends, ~2/3 came during a tick (bench/README.md, branch ctlcpu3);
- nothing is lost: the host keeps a result until the controller forgets the unit, after the commit.
"""

from __future__ import annotations

import threading
from typing import Any

from xce_lite.controller.start_wait import END_WAIT, quiet_launch
from xce_lite.exec.host import UnitFinished, UnitUnqueued

KEEP = 1  # jobs that must stay queued behind the one that starts for an end to be quiet
KEEP_BACKLOG = 3  # the same while more jobs pend than wait queued on hosts (module docstring)


class QuietEnds:
    """The `quiet` rule of the controller's event queue (seams.WakingQueue); see the module docstring."""

    def __init__(self, state: Any, clock: Any, enabled: bool = True) -> None:
        self.state, self.clock, self.enabled = state, clock, enabled
        # unit -> its job: units whose end may be quiet, and queued ones whose start may be (publish)
        self.ending: dict[str, int] = {}
        self.starting: dict[str, int] = {}
        self.since: float | None = None  # when the first quiet event since the last collect came
        self._mu = threading.Lock()  # `since` and the timer's (link threads of several hosts, the tick)
        self._timer = threading.Condition(self._mu)
        self._taken = 0  # collects so far: a window of quiet events ends with one
        self._thread: threading.Thread | None = None
        self._ticking = False  # between a tick's `taken` and its `publish` (guarded by _mu)
        self._deferred: list[tuple[Any, float]] = []  # (event, when it came): decided at `publish`

    def __call__(self, event: Any) -> bool:
        """Whether `event` needs no tick at once (on a link thread, after it was queued)."""
        if quiet_launch(event):
            return True
        quiet = self._quiet(event, self.ending, self.starting)
        if quiet is None:
            return False
        with self._mu:
            if not quiet:
                if not (self._ticking and self.enabled):
                    return False
                self._deferred.append((event, self.clock.time()))  # decided at the tick's publish
                return True
            self._stamp(self.clock.time())
        return True

    def _quiet(self, event: Any, ending: dict[str, int], starting: dict[str, int]) -> bool | None:
        """Whether `event` is quiet by the maps `ending` and `starting`; None: it never is (not an
        end nor a queued successor's start, or a job someone waits on)."""
        if isinstance(event, UnitFinished):
            job_id = ending.get(event.unit)
        elif isinstance(event, UnitUnqueued) and event.status in ("started", "running"):
            job_id = starting.get(event.unit)
        else:
            return None
        if job_id is not None and job_id in self.state.waited:
            return None
        return job_id is not None

    def _stamp(self, came: float) -> None:
        """A quiet event that came at `came` (holding _mu): the first of a window arms the timer."""
        if self.since is None or came < self.since:
            self.since = came
            if self._thread is None:
                self._thread = threading.Thread(target=self._wake_at_bound, name="quiet-ends", daemon=True)
                self._thread.start()
            self._timer.notify()

    def _wake_at_bound(self) -> None:
        """The timer: wake the tick END_WAIT after the first quiet event of a window the tick has not
        taken by then (taken: nothing to do; the next window arms it again)."""
        with self._timer:
            while True:
                if self.since is None:
                    self._timer.wait()
                    continue
                left = self.since + END_WAIT - self.clock.time()
                if left > 0:
                    self._timer.wait(left)  # (re-read: taken meanwhile, or the clock moved)
                    continue
                self.state.wake.set()
                window = self._taken
                while self._taken == window:  # until the tick takes them
                    self._timer.wait()

    def taken(self, starts: Any) -> None:
        """The tick is about to collect the queue: the quiet events wait no more; an end of theirs that
        StartWaits holds back (`starts`) is taken END_WAIT after the first came, not after this tick."""
        with self._mu:
            since, self.since = self.since, None
            self._taken += 1
            self._timer.notify()
            self._ticking = True
        if since is not None and (starts.ends_since is None or since < starts.ends_since):
            starts.ends_since = since

    def publish(self, urgent: bool) -> None:
        """Which units' ends and starts may be quiet until the next tick (the tick, holding the lock;
        `urgent`: a dependency gate, a commit retried, or the simulator's clock: none)."""
        state = self.state
        behind = state.behind
        if urgent or not self.enabled or not behind:
            self.ending, self.starting = {}, {}
            self._decide_deferred()
            return
        follower = {pred: job_id for job_id, pred in behind.items()}
        keep = KEEP_BACKLOG if len(state.pending) > len(behind) else KEEP
        ending: dict[str, int] = {}
        starting: dict[str, int] = {}
        for job_id, pred in behind.items():
            queued, link = 0, job_id
            while queued < keep and (link := follower.get(link)) is not None:
                queued += 1
            if queued < keep:
                continue
            for one, quiet in ((pred, ending), (job_id, starting)):  # its end, and its successor's start
                job = state.active.get(one)
                if (job is not None and len(job.units) == 1 and not (job.ending or job.killed or job.withdrawing)
                        and one not in state.waited):
                    quiet[job.units[0]] = one
        self.ending, self.starting = ending, starting  # replaced whole: the link threads read them unlocked
        self._decide_deferred()

    def _decide_deferred(self) -> None:
        """The events that came while the tick ran and the old maps did not make quiet, decided by the
        new ones (module docstring): any that is not quiet wakes the tick; the tick runs no more."""
        with self._mu:
            deferred, self._deferred, self._ticking = self._deferred, [], False
            loud = False
            for event, came in deferred:
                if self._quiet(event, self.ending, self.starting):
                    self._stamp(came)  # (its bound counts from when it came)
                else:
                    loud = True
        if loud:
            self.state.wake.set()

    def abandon(self) -> None:
        """A tick ended before its `publish` (it failed): what it deferred wakes the next one now."""
        self.ending, self.starting = {}, {}
        self._decide_deferred()

    def bound(self, wait: float) -> float:
        """`serve`'s sleep `wait`, no longer than a quiet event that came already may wait."""
        since = self.since
        if since is not None:
            wait = max(0.0, min(wait, since + END_WAIT - self.clock.time()))
        return wait
