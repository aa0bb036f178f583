"""The controller outlives a store that cannot take writes, and stops only when going on is unsafe
(issue 13). Kill wins and hosts that freeze: test_trust_kills.py.

Every fault is provoked for real: another process holding the store's write lock, a full file
system under the home (a tmpfs of our own), a store damaged under a running controller; and in
sequence with restarts, not one at a time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys


from tests.support.cluster import Cluster
from tests.support.faults import small_tmpfs, write_lock_held
from tests.support.trust import LOCAL_HOSTS, store_problem
from tests.support.waiting import wait_until


# ---- a store that cannot take writes ----------------------------------------------------------------


def test_a_store_locked_by_another_process_while_a_job_ends_loses_nothing(two_hosts: Cluster):
    c = two_hosts
    pid = c.controller_pid
    marker = c.work / "ended"
    job_id = c.submit("sh", "-c", f"sleep 2; touch {marker}")
    c.wait_state(job_id, {"RUN"})
    with write_lock_held(c.home / "xce.db"):
        wait_until(marker.exists, 30, "the job to end while the store is locked")
        problem = wait_until(lambda: store_problem(c), 60, "controller status to name the store's problem")
        assert "locked by another process" in problem
        assert "cannot be written" in c.ok("controller", "status")
        refused = c.xce("submit", "--", "true")
        assert refused.returncode == 4, (refused.returncode, refused.stderr)
        assert "locked by another process" in refused.stderr and "nothing of it was stored" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert c.job(job_id)["state"] == "RUN"  # reads go on; the end waits to be stored
    done = c.wait_state(job_id, {"DONE"}, timeout=60)
    assert done["attempt"] == 1
    wait_until(lambda: store_problem(c) is None, 60, "the store problem to clear by itself")
    assert c.xce("wait", str(c.submit("true"))).returncode == 0
    assert c.controller_pid == pid
    assert c.ok("jobs", "-a", "--json").count('"id"') == 2  # the refused submit left nothing


def fill(directory) -> object:
    """Fill the file system of `directory` to the last byte; the filler's path."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (b"\0" * 65536, b"\0"):
            with contextlib.suppress(OSError):
                while f.write(chunk):
                    pass
    return filler


def test_a_full_disk_while_a_job_ends_then_space_comes_back_loses_nothing():
    c = Cluster(config=LOCAL_HOSTS.format(pid=os.getpid(), lost_after="5m"))
    config = (c.home / "xce.yaml").read_text()
    try:
        with small_tmpfs(c.home, "8m", mode="0700"):
            (c.home / "xce.yaml").write_text(config)
            try:
                c.start()
                pid = c.controller_pid
                marker = c.work / "ended"
                job_id = c.submit("sh", "-c", f"sleep 2; touch {marker}; exit 3")
                c.wait_state(job_id, {"RUN"})
                filler = fill(c.home)
                wait_until(marker.exists, 30, "the job to end while the disk is full")
                problem = wait_until(lambda: store_problem(c), 60, "controller status to name the store's problem")
                assert "FullError" in problem and "free disk space" in problem
                refused = c.xce("submit", "--", "true")
                assert refused.returncode == 4 and "nothing of it was stored" in refused.stderr, refused.stderr
                assert c.job(job_id)["state"] == "RUN"  # reads go on
                filler.unlink()  # space comes back
                final = c.wait_state(job_id, {"EXIT"}, timeout=60)
                assert (final["exit_code"], final["attempt"]) == (3, 1)
                wait_until(lambda: store_problem(c) is None, 60, "the store problem to clear by itself")
                assert c.xce("wait", str(c.submit("true"))).returncode == 0
                assert c.controller_pid == pid
                check = subprocess.run([sys.executable, "-c", INTEGRITY, str(c.home / "xce.db")],
                                       capture_output=True, text=True)
                assert check.stdout.strip() == "ok", check
            finally:
                c.close()
    finally:
        shutil.rmtree(c.root, ignore_errors=True)


INTEGRITY = "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])"


# ---- the one fault it stops on ----------------------------------------------------------------------


BACKUP_AND_CORRUPT = """
import os, sqlite3, sys
db, backup = sys.argv[1], sys.argv[2]
src = sqlite3.connect(db)
dst = sqlite3.connect(backup)
src.backup(dst)
dst.close()
src.execute("PRAGMA wal_checkpoint(TRUNCATE)")
page = src.execute("PRAGMA page_size").fetchone()[0]
src.close()
size = os.path.getsize(db)
with open(db, "r+b") as f:  # every page but the first (the header and the schema stay readable)
    f.seek(page)
    f.write(b"\\xff" * (size - page))
    f.flush()
    os.fsync(f.fileno())
"""


def test_a_damaged_store_stops_the_controller_which_says_why_then_and_after_the_next_start(two_hosts: Cluster):
    c = two_hosts
    go = c.work / "go"
    job_id = c.submit("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done")
    c.wait_state(job_id, {"RUN"})
    pid = c.controller_pid
    backup = c.root / "backup.db"
    subprocess.run([sys.executable, "-c", BACKUP_AND_CORRUPT, str(c.home / "xce.db"), str(backup)], check=True)
    go.touch()  # the job ends: its commit meets the damage
    wait_until(lambda: c.controller_pid is None, 60, f"controller {pid} to stop")
    log = (c.home / "controller.log").read_text()
    assert "it is not safe to go on: the job store is damaged" in log and "Traceback" not in log
    down = c.xce("controller", "status")
    assert down.returncode == 3 and "stopped on a fault" in down.stderr and "damaged" in down.stderr, down
    # the operator restores the backup; the next start says why the last run stopped, and loses nothing
    for suffix in ("", "-wal", "-shm"):
        (c.home / f"xce.db{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, c.home / "xce.db")
    c.start()
    text = c.ok("controller", "status")
    assert "Its previous run stopped on a fault" in text and "damaged" in text
    final = c.wait_state(job_id, {"DONE"}, timeout=60)  # it ended while the controller was down
    assert final["attempt"] == 1
    c.ok("controller", "stop")
    c.start()
    assert "previous run" not in c.ok("controller", "status")  # a clean stop closes the story
