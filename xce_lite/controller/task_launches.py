"""`xce launch` (LSF's blaunch), the controller's side: a job asks for one copy of a command per
task, on every host it holds; the controller fans the tasks out to its units and answers the job
when they have all ended.

A part of the controller (`Controller.launches`), given the shared state, the hosts' workers
(hostops.py) and the log; the units' part (unitwork.py) tells it what it hears. The path:

1. a job runs `xce launch -- CMD` in its unit; the host's agent reports LaunchRequested;
2. the controller sends each host of the job its tasks (`Host.tasks`), task i of the job being the
   i-th slot in host order, with XCE_TASK_INDEX and the host's own XCE_HOST_NTASKS,
   XCE_HOST_TASK_INDEX and CUDA_VISIBLE_DEVICES over the caller's environment;
3. each task's end is a TaskFinished; when the last has ended, `launch_done` goes back to the
   agent that asked, with the worst exit code (a signal counts as 128 + its number, a task that
   could not start as 255), and `xce launch` exits with it.

A task whose unit ends (or whose host is out of reach when it should start) counts as ended with
255: the agent starts no task in a unit that is ending, and a unit's processes end with it.
Launches live in memory: a controller restart forgets them, and the waiting `xce launch` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xce_lite.controller.state import Active, ControllerState
from xce_lite.exec.host import LaunchRequested, Task, TaskFinished

FAILED = 255  # what a task that could not run, or was ended with its unit, counts as


@dataclass
class Launch:
    """One `xce launch` of a job: which tasks still run where, and the worst exit code so far."""

    host: str  # where the job asked, and is waiting for the answer
    launch_id: str
    job_id: int
    waiting: dict[int, int] = field(default_factory=dict)  # task index -> unit index (its host)
    worst: int = 0

    def ended(self, index: int, code: int) -> None:
        if self.waiting.pop(index, None) is not None:
            self.worst = max(self.worst, code)


class TaskLaunches:
    """See the module docstring. Every method but `send` is called holding the state's lock."""

    def __init__(self, state: ControllerState, hostops: Any, log: Callable[[str], None]) -> None:
        self.state, self.hostops, self.log = state, hostops, log
        self._launches: dict[tuple[str, str], Launch] = {}  # (asking host, launch id) -> Launch
        self._task_sends: list[tuple[str, str, tuple[str, str], list[Task]]] = []  # host, unit, key, tasks
        self._launch_answers: list[tuple[str, str, int]] = []  # host, launch id, exit code

    def requested(self, ask: LaunchRequested) -> None:
        """Split the launch into each host's tasks (sent by `send`). Holds the lock."""
        key = (ask.host, ask.launch_id)
        where = self.state.by_unit.get(ask.unit)
        job = self.state.active.get(where[0]) if where is not None else None
        if job is None or job.ending:
            self._launch_answers.append((ask.host, ask.launch_id, FAILED))
            self.log(f"xce launch from unit {ask.unit}: its job is not running; answered {FAILED}")
            return
        launch = self._launches[key] = Launch(ask.host, ask.launch_id, job.id)
        shares = self._host_environments(job)
        first = 0
        for unit_index, alloc in enumerate(job.holding.allocs):
            tasks = []
            for index in range(first, first + alloc.tasks):
                env = dict(ask.env)
                env.pop("CUDA_VISIBLE_DEVICES", None)
                env.update(shares[unit_index], XCE_TASK_INDEX=str(index))
                tasks.append(Task(index, ask.argv, env, ask.cwd))
                launch.waiting[index] = unit_index
            first += alloc.tasks
            self._task_sends.append((alloc.host, job.units[unit_index], key, tasks))

    def _host_environments(self, job: Active) -> list[dict[str, str]]:
        """Per unit of `job`, the variables that differ from host to host."""
        envs, first = [], 0
        for alloc in job.holding.allocs:
            env = {"XCE_HOST_NTASKS": str(alloc.tasks), "XCE_HOST_TASK_INDEX": str(first)}
            if alloc.gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, alloc.gpus))
            envs.append(env)
            first += alloc.tasks
        return envs

    def finished(self, done: TaskFinished) -> None:
        """One task ended; the launch is answered when it was the last. Holds the lock."""
        for key, launch in self._launches.items():
            if key[1] == done.launch_id and done.index in launch.waiting:
                if done.error is not None:
                    code = FAILED
                elif done.signal:
                    code = 128 + done.signal
                else:
                    code = done.exit_code if done.exit_code is not None else FAILED
                launch.ended(done.index, code)
                self._answer_if_done(key)
                return

    def unit_tasks_ended(self, job_id: int, unit_index: int | None = None) -> None:
        """The job's unit `unit_index` ended (or, with None, the whole job): its tasks with it. Holds the lock."""
        for key, launch in list(self._launches.items()):
            if launch.job_id != job_id:
                continue
            for index, where in list(launch.waiting.items()):
                if unit_index is None or where == unit_index:
                    launch.ended(index, FAILED)
            if unit_index is None:
                self._launches.pop(key)  # nobody is left to answer
            else:
                self._answer_if_done(key)

    def _answer_if_done(self, key: tuple[str, str]) -> None:
        launch = self._launches.get(key)
        if launch is not None and not launch.waiting:
            del self._launches[key]
            self._launch_answers.append((launch.host, launch.launch_id, launch.worst))

    def send(self) -> None:
        """After the commit, outside the lock: start the tasks, and answer the launches that ended.
        Both go on the host's worker (hostops.py), never on the tick; a failure comes back to
        `call_failed`."""
        with self.state.mu:
            sends, self._task_sends = self._task_sends, []
            answers, self._launch_answers = self._launch_answers, []
            hosts = {name: (self.state.hosts.get(name), self.state.generation.get(name, 0))
                     for name in {s[0] for s in sends} | {a[0] for a in answers}}
        for name, unit, key, tasks in sends:
            host, generation = hosts[name]
            about = ("tasks", key, tuple(t.index for t in tasks))
            if host is None:
                with self.state.mu:
                    self.call_failed(name, about, f"host {name} is out of reach")
                continue
            self.hostops.call(name, generation, host,
                               lambda h, unit=unit, key=key, tasks=tasks: h.tasks(unit, key[1], tasks), about)
        for name, launch_id, code in answers:
            host, generation = hosts[name]
            if host is None:
                continue  # the job's own host is out of reach: its `xce launch` waits, then says so
            self.hostops.call(name, generation, host,
                               lambda h, launch_id=launch_id, code=code: h.launch_done(launch_id, code),
                               ("answer", launch_id))

    def call_failed(self, name: str, about: tuple, error: str) -> None:
        """A round trip of `send` failed: tasks that could not start count as ended with
        FAILED. Holds the lock."""
        if about[0] == "answer":
            self.log(f"xce launch {about[1]}: could not answer host {name}: {error}")
            return
        _kind, key, indices = about
        self.log(f"xce launch {key[1]}: {len(indices)} task(s) on host {name} could not start: {error}")
        launch = self._launches.get(key)
        if launch is not None:
            for index in indices:
                launch.ended(index, FAILED)
            self._answer_if_done(key)
            if self._launch_answers:
                self.state.wake.set()  # its answer goes with the next tick's act
