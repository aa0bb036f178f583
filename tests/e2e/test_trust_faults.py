"""The controller outlives faults, kill wins, and a copy the controller gave up on never counts (issue 13).

Every fault is provoked for real: another process holding the store's write lock, a full file
system under the home (a tmpfs of our own), a frozen sshd (SIGSTOP) on a real test host, hosts
out of reach and lost, controller restarts; and in sequence, not one at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid

import pytest

from tests.e2e.test_e2e_hosts import HostOutage, hosts_of
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from xce_lite import testhosts

LOCAL_HOSTS = """\
cluster: tf{pid}
hosts:
  - {{name: a, slots: 1, mem: 1G, tags: [ha]}}
  - {{name: b, slots: 1, mem: 1G, tags: [hb]}}
queues:
  - {{name: normal, default: true}}
controller:
  tick: 1s
  grace: 1s
  host_lost_after: {lost_after}
"""


def status(c: Cluster) -> dict:
    return json.loads(c.ok("controller", "status", "--json"))


def store_problem(c: Cluster) -> str | None:
    found = [p for p in status(c).get("problems", []) if p["what"] == "store"]
    return found[0]["why"] if found else None


def history(c: Cluster, job_id: int) -> list[str]:
    job = json.loads(c.ok("jobs", "-l", "--json", str(job_id)))["jobs"][0]
    return [event["kind"] for event in job["history"]]


@pytest.fixture
def two_hosts(request):
    c = Cluster(config=LOCAL_HOSTS.format(pid=os.getpid(), lost_after=getattr(request, "param", "3s")))
    c.start()
    try:
        yield c
    finally:
        c.close()


# ---- a store that cannot take writes ----------------------------------------------------------------


HOLDER = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # until the test lets go
con.execute("ROLLBACK")
"""


def test_a_store_locked_by_another_process_while_a_job_ends_loses_nothing(two_hosts: Cluster):
    c = two_hosts
    pid = c.controller_pid
    marker = c.work / "ended"
    job_id = c.submit("sh", "-c", f"sleep 2; touch {marker}")
    c.wait_state(job_id, {"RUN"})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(c.home / "xce.db")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        wait_until(marker.exists, 30, "the job to end while the store is locked")
        problem = wait_until(lambda: store_problem(c), 60, "controller status to name the store's problem")
        assert "locked by another process" in problem
        assert "cannot be written" in c.ok("controller", "status")
        refused = c.xce("submit", "--", "true")
        assert refused.returncode == 4, (refused.returncode, refused.stderr)
        assert "locked by another process" in refused.stderr and "nothing of it was stored" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert c.job(job_id)["state"] == "RUN"  # reads go on; the end waits to be stored
    finally:
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()
    done = c.wait_state(job_id, {"DONE"}, timeout=60)
    assert done["attempt"] == 1
    wait_until(lambda: store_problem(c) is None, 60, "the store problem to clear by itself")
    assert c.xce("wait", str(c.submit("true"))).returncode == 0
    assert c.controller_pid == pid
    assert c.ok("jobs", "-a", "--json").count('"id"') == 2  # the refused submit left nothing


@contextlib.contextmanager
def small_tmpfs(path, size="8m"):
    path.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


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
        with small_tmpfs(c.home):
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


# ---- kill wins -------------------------------------------------------------------------------------


def runs(log) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_kill_while_the_host_is_out_of_reach_then_lost_then_back_ends_exit_and_never_runs_again(two_hosts: Cluster):
    c = two_hosts
    log = c.work / "attempts"
    job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; trap "exit 0" TERM; sleep 120 & wait',
                      options=("-R", "select[ha]"))
    c.wait_state(job_id, {"RUN"})
    with HostOutage(c, "a"):
        wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
        killed = c.xce("kill", str(job_id))
        assert killed.returncode == 0 and "does not answer now" in killed.stdout, killed
        final = c.wait_state(job_id, {"EXIT"}, timeout=60)  # once a is declared lost
        assert final["reason"].startswith("killed by") and "lost" in final["reason"], final["reason"]
        assert hosts_of(c)["a"]["lost"] is True
        assert "requeued" not in history(c, job_id)
        assert len(c.supervisor_pids()) == 1  # the copy on a runs on: nobody can reach it
    wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
    wait_until(lambda: not c.supervisor_pids(), 60, "the copy on a to be stopped once a answers")
    assert runs(log) == ["1"]
    final = c.job(job_id)
    assert (final["state"], final["attempt"]) == ("EXIT", 1) and final["reason"].startswith("killed by")
    assert "requeued" not in history(c, job_id)


def test_kill_then_controller_restart_then_host_lost_ends_exit_with_the_kill_reason(two_hosts: Cluster):
    c = two_hosts
    log = c.work / "attempts"
    job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; trap "exit 0" TERM; sleep 120 & wait',
                      options=("-R", "select[ha]"))
    c.wait_state(job_id, {"RUN"})
    with HostOutage(c, "a"):
        wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
        assert c.xce("kill", str(job_id)).returncode == 0
        c.kill9_controller()  # before the host is declared lost: the kill must survive the restart
        c.start()
        final = c.wait_state(job_id, {"EXIT"}, timeout=60)
        assert final["reason"].startswith("killed by") and "lost" in final["reason"], final["reason"]
        assert "requeued" not in history(c, job_id)
    wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
    wait_until(lambda: not c.supervisor_pids(), 60, "the copy on a to be stopped once a answers")
    assert runs(log) == ["1"]
    assert c.job(job_id)["state"] == "EXIT" and c.job(job_id)["attempt"] == 1


@pytest.mark.parametrize("two_hosts", ["5m"], indirect=True)
def test_kill_while_the_host_is_out_of_reach_is_delivered_when_it_answers(two_hosts: Cluster):
    c = two_hosts
    job_id = c.submit("sh", "-c", "trap 'exit 0' TERM; sleep 120 & wait", options=("-R", "select[ha]"))
    c.wait_state(job_id, {"RUN"})
    with HostOutage(c, "a"):
        wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
        assert c.xce("kill", str(job_id)).returncode == 0
        c.kill9_controller()
        c.start()
        assert c.job(job_id)["state"] == "RUN"
    final = c.wait_state(job_id, {"EXIT"}, timeout=60)  # the recorded kill reached a when it answered
    assert final["reason"].startswith("killed by") and final["attempt"] == 1
    assert not c.supervisor_pids()
    assert "requeued" not in history(c, job_id)


# ---- a host that freezes ----------------------------------------------------------------------------


def frozen_host_config(host: testhosts.TestHost, keepalive: str = "10m", lost_after: str = "10m") -> str:
    """The ssh host `host` (tag `far`) and a local host (tag `near`); by default heartbeats too rare
    to notice a freeze, so that the host operation itself meets it."""
    return (f"cluster: fz{os.getpid()}\nhosts:\n"
            f"  - {{name: {host.name}, type: ssh, address: '{host.ip}', user: root, identity: '{host.key_path}', "
            f"slots: 2, mem: 1G, tags: [far]}}\n"
            f"  - {{name: near, slots: 1, mem: 1G, tags: [near]}}\n"
            f"queues:\n  - {{name: normal, default: true}}\n"
            f"ssh:\n  config: /nonexistent\n  known_hosts: {json.dumps([str(host.known_hosts_path)])}\n"
            f"  keepalive: {keepalive}\n  reconnect_max: 2s\n"
            f"controller:\n  tick: 1s\n  grace: 1s\n  host_lost_after: {lost_after}\n")


@pytest.mark.parametrize("kind", ["systemd", "plain"])
def test_kill_on_a_host_whose_sshd_is_frozen_troubles_that_host_alone_and_lands_when_it_thaws(
        kind, request, testhosts_root):
    host = request.getfixturevalue(f"{kind}_hosts")[0]
    c = Cluster(config=frozen_host_config(host), work=testhosts_root / f"work-{uuid.uuid4().hex[:8]}")
    c.start()
    frozen: list[int] = []
    try:
        wait_until(lambda: all(h["state"] == "ok" for h in hosts_of(c).values()), 60, "both hosts up")
        pid = c.controller_pid
        job_id = c.submit("sleep", "300", options=("-R", "select[far]"))
        c.wait_state(job_id, {"RUN"}, timeout=60)
        frozen = [p for p in testhosts.namespace_pids(host.pid) if testhosts._comm(p) == "sshd"]
        for p in frozen:  # the listener and the controller's session: the host neither answers nor drops
            os.kill(p, signal.SIGSTOP)
        killed = c.xce("kill", str(job_id))
        assert killed.returncode == 0 and "is being terminated" in killed.stdout, killed
        assert c.xce("wait", str(c.submit("true", options=("-R", "select[near]")))).returncode == 0  # work goes on
        listing = wait_until(lambda: (text := c.ok("hosts", "-l")) and "in trouble" in text and text, 90,
                             f"{host.name} to show in trouble")
        assert "did not answer 'signal'" in listing
        problems = status(c)["problems"]
        assert [p["host"] for p in problems if p["what"] == "host"] == [host.name]
        assert hosts_of(c)["near"]["trouble"] is None
        assert c.job(job_id)["state"] == "RUN" and c.controller_pid == pid
        for p in frozen:
            os.kill(p, signal.SIGCONT)
        frozen = []
        final = c.wait_state(job_id, {"EXIT"}, timeout=90)
        assert final["reason"].startswith("killed by"), final
        wait_until(lambda: hosts_of(c)[host.name]["trouble"] is None, 60, f"{host.name} out of trouble")
        assert c.controller_pid == pid and "requeued" not in history(c, job_id)
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        with contextlib.suppress(Exception):
            c.xce("kill", *[str(j["id"]) for j in json.loads(c.ok("jobs", "--json"))["jobs"]])
        c.close()


@pytest.mark.parametrize("kind", ["systemd", "plain"])
def test_kill_while_a_frozen_host_is_out_of_reach_then_lost_then_thawed_never_runs_the_job_again(
        kind, request, testhosts_root):
    host = request.getfixturevalue(f"{kind}_hosts")[0]
    c = Cluster(config=frozen_host_config(host, keepalive="1s", lost_after="3s"),
                work=testhosts_root / f"work-{uuid.uuid4().hex[:8]}")
    c.start()
    frozen: list[int] = []
    try:
        wait_until(lambda: all(h["state"] == "ok" for h in hosts_of(c).values()), 60, "both hosts up")
        log, stopped = c.work / "attempts", c.work / "stopped"
        job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; trap "touch {stopped}; exit 0" TERM; '
                                      "sleep 300 & wait", options=("-R", "select[far]"))
        c.wait_state(job_id, {"RUN"}, timeout=60)
        frozen = [p for p in testhosts.namespace_pids(host.pid) if testhosts._comm(p) == "sshd"]
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        wait_until(lambda: hosts_of(c)[host.name]["state"] == "unreach", 90, f"{host.name} to show unreach")
        killed = c.xce("kill", str(job_id))
        assert killed.returncode == 0 and "does not answer now" in killed.stdout, killed
        final = c.wait_state(job_id, {"EXIT"}, timeout=60)  # once the host is declared lost
        assert final["reason"].startswith("killed by") and "lost" in final["reason"], final["reason"]
        for p in frozen:
            os.kill(p, signal.SIGCONT)
        frozen = []
        wait_until(lambda: hosts_of(c)[host.name]["state"] == "ok", 90, f"{host.name} to answer again")
        wait_until(stopped.exists, 60, "the copy on the thawed host to be stopped")
        final = c.job(job_id)
        assert (final["state"], final["attempt"]) == ("EXIT", 1) and final["reason"].startswith("killed by")
        assert runs(log) == ["1"] and "requeued" not in history(c, job_id)
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        c.close()


# ---- copies the controller gave up on ---------------------------------------------------------------


def test_the_result_of_a_copy_given_up_on_never_counts_across_a_restart(two_hosts: Cluster):
    """Host lost, job requeued and done elsewhere; the first copy ends (exit 7) while its host is
    away; the controller restarts; the host comes back with that result: it is forgotten."""
    c = two_hosts
    log, go = c.work / "attempts", c.work / "go"
    job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; '
                                  f'if [ "$XCE_ATTEMPT" = 1 ]; then while [ ! -e {go} ]; do sleep 0.1; done; '
                                  f'touch {c.work}/ended1; exit 7; fi')
    first = c.wait_state(job_id, {"RUN"})["hosts"][0][0]
    with HostOutage(c, first):
        done = c.wait_state(job_id, {"DONE"}, timeout=60)  # lost, requeued, run on the other host
        assert done["attempt"] == 2 and done["hosts"][0][0] != first
        go.touch()
        wait_until((c.work / "ended1").exists, 30, "the first copy to end while its host is away")
        c.kill9_controller()
        c.start()
    wait_until(lambda: hosts_of(c)[first]["state"] == "ok", 60, f"host {first} to come back")
    wait_until(lambda: not c.supervisor_pids(), 60, "no copy left running")
    c.ok("hosts")  # one more round trip: the host's listing is reconciled by now
    final = c.job(job_id)
    assert (final["state"], final["exit_code"], final["attempt"]) == ("DONE", 0, 2)
    assert runs(log) == ["1", "2"]
    assert history(c, job_id).count("finished") == 1


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
