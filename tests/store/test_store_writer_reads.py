"""`JobStore.jobs(ids, writer=True)`, the controller's tick's read of the rows it dispatches: the same
jobs as a read connection returns, read through the writer connection, whose page cache outlives
its own commits. A read connection's does not: SQLite drops it when another connection committed
since its last read, so the tick's own read connection read every page of its path from the file
again after each tick's commit (~4 `pread`s per job in bench/cpu_per_job.py). The pages read are
counted by a VFS that passes every call to the default one."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from xce_lite.models import JobSpec
from xce_lite.store.jobs import Finish, JobStore, Plan, TickWrites


class CountingFile(apsw.VFSFile):
    reads = 0

    def xRead(self, amount, offset):
        type(self).reads += 1
        return super().xRead(amount, offset)


class CountingVFS(apsw.VFS):
    def __init__(self) -> None:
        self.base = apsw.vfs_names()[0]  # the default until this one is made the default
        super().__init__("counting-reads", self.base, makedefault=True)

    def xOpen(self, name, flags):
        return CountingFile(self.base, name, flags)


@pytest.fixture
def counting():
    vfs = CountingVFS()
    try:
        yield CountingFile
    finally:
        vfs.unregister()


def test_the_writers_read_after_its_commit_reads_no_page_again(tmp_path: Path, counting):
    store = JobStore(tmp_path / "xce.db")
    try:
        spec = JobSpec(argv=("true",), cwd="/tmp", env={"PATH": "/usr/bin"})
        ids = store.submit([(spec, "normal")] * 200, "u1", 1.0)
        store.jobs(ids[:1])  # this thread's read connection exists
        for k, job_id in enumerate(ids[:50]):
            writes = TickWrites(2.0 + k, plans=[Plan(job_id, 1, [["h1", 1]], f"u-{job_id}", None, None)],
                                finishes=[(Finish(ids[k - 1], "DISP", "DONE", 2.0, 2.0 + k, 0, None, None, None,
                                                  None), "finished")] if k else [])
            store.record_tick(writes)
            counting.reads = 0
            by_writer = store.jobs([job_id + 1, job_id], writer=True)
            writer_reads = counting.reads
            counting.reads = 0
            by_reader = store.jobs([job_id + 1, job_id])
            assert by_writer == by_reader and [j.state for j in by_writer] == ["DISP", "PEND"]
            assert writer_reads == 0  # its cache holds every page it committed
            assert counting.reads > 0  # the reader's cache was dropped by the writer's commit
    finally:
        store.close()
