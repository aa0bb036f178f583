"""store/projects.py and the project column (migration 0010): a job's project is stored with it (and
with every element of an array), listed by project, counted per project, and the past usage fair
share reads comes back with each finished job's slots and GPUs. An old store opens: its jobs have
no project."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.store import DATA, T, finish, spec
from xce_lite.models import PEND, PSUSP, RUN
from xce_lite.store.jobs import JobStore
from xce_lite.store.workflows import NewJob

ALLOC = {"allocs": [["h1", 2, {"slots": 2, "gpus": 2}, [0, 1]], ["h2", 1, {"slots": 1}, []]], "shared": {}}


def test_a_jobs_project_is_stored_listed_and_counted(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    try:
        ids = store.submit([NewJob(spec(project="lab/vision"), "normal"),
                            NewJob(spec(project="lab", hold=True), "normal", (1, 2, 3)),
                            NewJob(spec(), "normal")], "alice", T)
        assert [j.project for j in store.jobs(include_finished=True)] == ["lab/vision", "lab", "lab", "lab", None]
        assert [j.id for j in store.jobs(user="alice", project="lab")] == [ids[1], ids[1] + 1, ids[1] + 2]
        assert store.counts_by_project() == {("lab/vision", PEND): 1, ("lab", PSUSP): 3, (None, PEND): 1}
        assert [s["project"] for s in store.array_summaries()] == ["lab"]
        assert store.events(ids[0])[0][2]["project"] == "lab/vision"
    finally:
        store.close()


def test_fair_share_reads_each_finished_jobs_run_slots_and_gpus(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    try:
        first, second, _pending = store.submit([NewJob(spec(project="lab"), "normal")] * 3, "bob", T)
        store.dispatch([(first, 1, [["h1", 2], ["h2", 1]], "u1", ALLOC), (second, 1, [["h1", 1]], "u2", None)], T)
        store.started([(first, T + 1), (second, T + 2)], T + 2)
        store.finish([finish(first), finish(second, end_time=T + 4)], T + 10)
        assert sorted(store.fairshare_usage(T)) == [("bob", "lab", T + 1, T + 10, 3, 2),
                                                    ("bob", "lab", T + 2, T + 4, 1, 0)]
        assert store.fairshare_usage(T + 5) == [("bob", "lab", T + 1, T + 10, 3, 2)]  # ended since
        assert store.jobs([first])[0].state != RUN
    finally:
        store.close()


def test_fair_share_still_counts_a_job_that_retention_archived(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.db")
    try:
        (job,) = store.submit([NewJob(spec(project="lab"), "normal")], "bob", T)
        store.dispatch([(job, 1, [["h1", 2]], "u1", ALLOC)], T)
        store.started([(job, T + 1)], T + 1)
        store.finish([finish(job)], T + 10)
        before = store.fairshare_usage(T)
        assert store.retain(cutoff=T + 100, batch=10).jobs == 1
        assert store.jobs([job]) == []  # gone from the live tables...
        assert store.fairshare_usage(T) == before  # ...not from the usage fair share decays
    finally:
        store.close()


def test_an_old_store_opens_with_no_project_on_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copy(DATA / "store_v1.db", path)
    store = JobStore(path)
    try:
        jobs = store.jobs(include_finished=True)
        assert jobs and all(j.project is None for j in jobs)
        assert all(project is None for project, _state in store.counts_by_project())
        assert all(row[1] is None for row in store.fairshare_usage(0))
        new = store.submit([NewJob(spec(project="lab"), "normal")], "alice", T + 100)[0]
        assert store.get(new).project == "lab"
    finally:
        store.close()
