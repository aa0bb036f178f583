"""store/db.py on real SQLite files: opening a store.

Pragmas, file modes, migrations, and refusing every file that is not ours without writing a byte.
`data/store_v1.db` is an old store that every future version must still open: never regenerate it.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from tests.support import paths
from tests.support.store import DATA, T, V1_JOBS, finish, raw, spec
from xce_lite.errors import HomeError, StoreError
from xce_lite.models import DISP, DONE, PEND, JobSpec
from xce_lite.store import db
from xce_lite.store.jobs import JobStore

# ---- helpers ----------------------------------------------------------------------------------


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- opening ----------------------------------------------------------------------------------


def test_connection_pragmas(path: Path) -> None:
    con = db.connect(path)
    try:
        assert con.execute("PRAGMA journal_mode").get == "wal"
        assert con.execute("PRAGMA synchronous").get == 2  # FULL
        assert con.execute("PRAGMA foreign_keys").get == 1
        assert con.execute("PRAGMA busy_timeout").get >= 1000
        # double-quoted string literals off: a misspelt column is an error, not the string "colunm"
        with pytest.raises(apsw.SQLError, match="no such column"):
            con.execute('SELECT "no_such_column" FROM jobs')
    finally:
        con.close()


def test_the_store_its_wal_and_shm_are_0600_whatever_the_umask(path: Path) -> None:
    old = os.umask(0o022)  # what a user's shell usually has: SQLite alone would make them 0644
    try:
        s = JobStore(path)
        s.submit([(spec(env={"SECRET": "s3cret"}), "normal")], "alice", T)
    finally:
        os.umask(old)
    try:
        modes = {name: oct(os.stat(f"{path}{name}").st_mode & 0o777) for name in ("", "-wal", "-shm")}
        assert modes == {"": "0o600", "-wal": "0o600", "-shm": "0o600"}
    finally:
        s.close()


def test_a_store_left_open_to_others_is_closed_when_opened(tmp_path: Path) -> None:
    copy = tmp_path / "store_v1.db"  # as an older version left it: 0644, its WAL too
    shutil.copyfile(DATA / "store_v1.db", copy)
    Path(f"{copy}-wal").write_bytes(b"")
    for name in (copy, Path(f"{copy}-wal")):
        os.chmod(name, 0o644)
    JobStore(copy).close()
    assert oct(copy.stat().st_mode & 0o777) == "0o600"
    assert not Path(f"{copy}-wal").exists() or oct(Path(f"{copy}-wal").stat().st_mode & 0o777) == "0o600"


def test_a_database_that_is_not_ours_keeps_its_mode(path: Path) -> None:
    con = raw(path)
    con.execute("PRAGMA application_id=305419896")
    con.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
    con.close()
    os.chmod(path, 0o644)
    with pytest.raises(HomeError, match="another application"):
        JobStore(path)
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_wal_mode_is_kept_in_the_file(store: JobStore, path: Path) -> None:
    con = raw(path)
    try:
        assert con.execute("PRAGMA journal_mode").get == "wal"
    finally:
        con.close()


def test_user_version_is_the_number_of_migrations(store: JobStore, path: Path) -> None:
    files = sorted((paths.ROOT / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql"))
    assert files, "no migrations shipped"
    assert [int(f.name[:4]) for f in files] == list(range(1, len(files) + 1))
    con = raw(path)
    try:
        assert con.execute("PRAGMA user_version").get == len(files) == db.latest_version()
        assert con.execute("PRAGMA application_id").get == db.APPLICATION_ID
    finally:
        con.close()


def test_reopening_keeps_the_data(path: Path) -> None:
    first = JobStore(path)
    ids = first.submit([(spec("a"), "normal"), (spec("b", hold=True), "low")], "alice", T)
    first.set_meta("cluster", "c1")
    before = first.jobs(include_finished=True)
    first.close()

    second = JobStore(path)
    try:
        assert second.jobs(include_finished=True) == before
        assert [kind for _, kind, _ in second.events(ids[1])] == ["submitted"]
        assert second.meta("cluster") == "c1"
        assert second.integrity() == "ok"
        assert second.submit([(spec("c"), "normal")], "bob", T + 1) == [3]
    finally:
        second.close()


def test_a_store_newer_than_the_code_is_refused_untouched(path: Path) -> None:
    JobStore(path).close()
    con = raw(path)
    con.execute(f"PRAGMA user_version={db.latest_version() + 1}")
    con.close()
    before = digest(path)
    with pytest.raises(StoreError, match="upgrade") as caught:
        JobStore(path)
    assert str(path) in str(caught.value)
    assert digest(path) == before


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(random.Random(1).randbytes(8192), id="random-bytes"),
        pytest.param(b"SQLite format 3\0" + random.Random(2).randbytes(8192), id="sqlite-magic-then-garbage"),
        pytest.param(b"cluster: mine\nhosts: []\n" * 200, id="text-file"),
    ],
)
def test_a_file_that_is_not_sqlite_is_refused_untouched(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    with pytest.raises(HomeError, match="not an xce_lite job store") as caught:
        JobStore(path)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == content


@pytest.mark.parametrize("application_id", [0, 0x12345678])
def test_another_applications_database_is_refused_untouched(path: Path, application_id: int) -> None:
    con = raw(path)
    con.execute(f"PRAGMA application_id={application_id}")
    con.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, title TEXT)")
    con.execute("INSERT INTO photos (title) VALUES ('beach')")
    con.close()
    before = digest(path)
    with pytest.raises(HomeError, match="another application") as caught:
        JobStore(path)
    assert str(path) in str(caught.value)
    assert digest(path) == before
    con = raw(path)
    try:
        assert con.execute("SELECT title FROM photos").get == "beach"
    finally:
        con.close()


# ---- the old store: future migrations must keep opening it ----------------------------------

@pytest.fixture
def v1_store(tmp_path: Path) -> Iterator[JobStore]:
    # a copy: opening migrates the file, and the checked-in one must stay at schema 1
    copy = tmp_path / "store_v1.db"
    shutil.copyfile(DATA / "store_v1.db", copy)
    s = JobStore(copy)
    yield s
    s.close()


def test_the_v1_fixture_is_still_schema_1() -> None:
    header = (DATA / "store_v1.db").read_bytes()[:100]
    assert header[:16] == b"SQLite format 3\0"
    assert int.from_bytes(header[60:64], "big") == 1  # user_version
    assert int.from_bytes(header[68:72], "big") == db.APPLICATION_ID


def test_the_v1_store_opens_and_reads_back(v1_store: JobStore) -> None:
    assert v1_store.integrity() == "ok"
    con = raw(v1_store.path)
    try:
        assert con.execute("PRAGMA user_version").get == db.latest_version()  # migrated on open
    finally:
        con.close()
    assert v1_store.meta("cluster") == "fixture"
    jobs = {j.id: j for j in v1_store.jobs(include_finished=True)}
    assert sorted(jobs) == sorted(V1_JOBS)
    for job_id, (state, queue, argv, hosts, unit, start, end, code, reason, kinds) in V1_JOBS.items():
        j = jobs[job_id]
        assert (j.user, j.state, j.queue, j.spec.argv, j.hosts, j.unit) == ("alice", state, queue, argv, hosts, unit)
        assert (j.submit_time, j.start_time, j.end_time, j.exit_code, j.reason) == (T, start, end, code, reason)
        assert [kind for _, kind, _ in v1_store.events(job_id)] == kinds
    assert jobs[1].spec == JobSpec(argv=("sleep", "60"), cwd="/home/alice/work", name="pending", env={"A": "1"},
                                   slots=1)
    assert jobs[2].pend_reason == "not enough free slots: needs 1, at most 0 free on any host"
    assert jobs[3].spec.hold is True
    assert (jobs[5].spec.slots, jobs[5].spec.run_limit, jobs[5].spec.mem_limit) == (2, 3600.0, 4 * 1024**3)
    assert jobs[6].spec.stdout == "/home/alice/out-%J.txt"
    assert (jobs[7].cpu_time, jobs[7].max_rss) == (0.25, 1048576)
    assert jobs[12].spec.env == {"X": "l1\nl2", "Y": "\udcff"}
    assert [j.id for j in v1_store.unfinished()] == [1, 2, 3, 4, 5, 6, 12]


def test_the_v1_store_takes_new_writes(v1_store: JobStore) -> None:
    assert v1_store.dispatch([(1, 1, [["h1", 1]], "xce-fixture-1-1-0")], T + 10) == [1]
    assert v1_store.finish([finish(6, end_time=T + 11)], T + 11) == [6]
    assert v1_store.submit([(spec("new"), "normal")], "bob", T + 12) == [13]
    assert (v1_store.get(1).state, v1_store.get(6).state, v1_store.get(13).state) == (DISP, DONE, PEND)
