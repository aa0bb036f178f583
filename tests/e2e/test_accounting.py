"""`xce hist` and `xce acct` through the real controller, and retention while it runs.

The numbers are checked against what ran (each job's own times, slots and CPU time), and retention
is checked across a controller killed and restarted in the middle: only old finished jobs move,
never a running or held one, and accounting counts the archived ones.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

from tests.support.cluster import Cluster, hosts_ok
from tests.support.waiting import wait_until

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"


def _config(keep: str) -> str:
    return textwrap.dedent(f"""\
        cluster: t{os.getpid()}
        hosts:
          - name: local
            slots: 4
            mem: 1G
        queues:
          - name: normal
            default: true
          - name: high
            priority: 50
        controller:
          tick: 1s
          grace: 2s
          keep_finished: {keep}
          keep_archived: 400d
        """)


def _json(cluster: Cluster, *args: str) -> dict:
    return json.loads(cluster.ok(*args, "--json"))


def test_hist_and_acct_report_what_ran() -> None:
    c = Cluster(config=_config("30d"))
    try:
        c.start()
        burn = c.submit("python3", "-c", BURN, options=("-J", "burn", "-n", "2"))
        failed = c.submit("sh", "-c", "exit 3", options=("-q", "high"))
        for job_id in (burn, failed):
            c.xce("wait", str(job_id))
        ran = {j: c.job(j) for j in (burn, failed)}

        history = _json(c, "hist", str(burn))
        (job,) = history["jobs"]
        assert history["schema"] == 1 and job["id"] == burn and not job["archived"]
        assert [e["kind"] for e in job["events"]] == ["submitted", "dispatched", "started", "finished"]
        assert job["time_in_states"]["RUN"] > 0 and job["time_in_states"]["total"] >= job["time_in_states"]["RUN"]
        text = c.ok("hist", str(burn), str(failed))
        assert f"Job <{burn}>, Job Name <burn>" in text and "Done successfully; CPU time" in text
        assert "Exited with exit code 3" in text and "Time in states:" in text

        summary = _json(c, "acct", "--by", "queue")
        rows = {r["key"]: r for r in summary["rows"]}
        assert set(rows) == {"normal", "high"}
        assert (rows["normal"]["jobs"], rows["normal"]["done"], rows["high"]["exit"]) == (1, 1, 1)
        b = ran[burn]
        assert rows["normal"]["run"]["total"] == round(b["end_time"] - b["start_time"], 4)
        assert rows["normal"]["slot_seconds"] == round((b["end_time"] - b["start_time"]) * b["slots"], 4)
        assert rows["normal"]["wait"] == {**rows["normal"]["wait"], "exact": True,
                                          "median": round(b["start_time"] - b["submit_time"], 4)}
        assert rows["normal"]["cpu_time"] == round(b["cpu_time"], 4) and b["cpu_time"] >= 0.4
        assert rows["normal"]["max_rss"] == b["max_rss"] > 0
        assert 0 < rows["normal"]["efficiency"] <= 1.0  # 0.4 s of CPU over 2 slots x its run time
        assert summary["total"]["jobs"] == 2
        by_user = c.ok("acct")
        assert "WAIT_MEDIAN" in by_user and "EFFICIENCY" in by_user
        # a time a user typed wrong is a message, not a traceback
        wrong = c.xce("acct", "--since", "last tuesday")
        assert wrong.returncode == 2 and "not a time" in wrong.stderr and "Traceback" not in wrong.stderr
    finally:
        c.close()


def test_retention_moves_only_old_finished_jobs_across_a_restart() -> None:
    c = Cluster(config=_config("2s"))
    try:
        c.start()
        go = c.work / "go"
        done = c.submit("python3", "-c", BURN)
        failed = c.submit("sh", "-c", "exit 3")
        running = c.submit("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done")
        held = c.submit("true", options=("-H",))
        for job_id in (done, failed):
            c.xce("wait", str(job_id))
        c.wait_state(running, {"RUN"})

        def archived(ids: list[int]) -> bool:
            found = {j["id"]: j["archived"] for j in _json(c, "hist", *map(str, ids))["jobs"]}
            return all(found.get(i) for i in ids)

        wait_until(lambda: archived([done, failed]), 30, "the finished jobs to be archived")
        listed = {j["id"]: j["state"] for j in _json(c, "jobs", "-a")["jobs"]}
        assert listed == {running: "RUN", held: "PSUSP"}  # the old finished ones left the live table
        gone = c.xce("jobs", str(done))
        assert gone.returncode == 2 and f"`xce hist {done}` shows it" in gone.stderr

        c.kill9_controller()
        c.start()
        assert c.wait_state(running, {"RUN"})["state"] == "RUN"  # adopted, never archived
        go.touch()
        c.wait_state(running, {"DONE"})
        wait_until(lambda: archived([done, failed, running]), 30, "the job that ended after the restart to go too")
        assert c.job(held)["state"] == "PSUSP"

        # what ran, as the archive keeps it (the store tests check it is the live row, copied)
        ran = {j["id"]: j for j in _json(c, "hist", str(done), str(failed), str(running))["jobs"]}
        assert [e["kind"] for e in ran[done]["events"]] == ["submitted", "dispatched", "started", "finished"]
        assert ran[done]["cpu_time"] >= 0.4 and ran[failed]["exit_code"] == 3
        total = _json(c, "acct")["total"]
        assert (total["jobs"], total["done"], total["exit"]) == (3, 2, 1)
        assert abs(total["run"]["total"] - sum(j["end_time"] - j["start_time"] for j in ran.values())) < 1e-3
        assert abs(total["cpu_time"] - sum(j["cpu_time"] for j in ran.values())) < 1e-3
        assert "[archived]" in c.ok("hist", str(failed))
    finally:
        c.close()


# what the hosts measure: CPU time and peak memory, from the cgroup on systemd hosts and from the
# supervisor on plain ones. The job burns 0.4 s of CPU and holds 64 MB.
HEAVY = ("import time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
         "t = time.process_time()\nwhile time.process_time() - t < 0.4: pass")


def test_acct_by_host_has_the_cpu_time_and_memory_each_kind_of_host_measured(systemd_hosts, plain_hosts,
                                                                                  testhosts_root) -> None:
    from tests.support.remote import close, remote_config, started_cluster

    sd, plain = systemd_hosts[0], plain_hosts[0]
    config = remote_config([sd, plain])  # the two hosts under names of their own, each with a tag
    lines = [line for line in config.splitlines(keepends=True) if "type: ssh" not in line]
    entries = [f"  - {{name: {name}, type: ssh, address: '{h.ip}', user: root, identity: '{h.key_path}', "
               f"slots: 2, mem: 1G, tags: [{name}]}}\n" for name, h in (("sd", sd), ("pl", plain))]
    at = lines.index("hosts:\n") + 1
    config = "".join(lines[:at] + entries + lines[at:])
    c = started_cluster(config, testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        ids = {tag: c.submit(sys.executable, "-c", HEAVY, options=("-R", f"select[{tag}]")) for tag in ("sd", "pl")}
        for job_id in ids.values():
            assert c.wait_state(job_id, {"DONE", "EXIT"}, timeout=90)["state"] == "DONE"
        rows = {r["key"]: r for r in _json(c, "acct", "--by", "host")["rows"]}
        assert set(rows) == {"sd", "pl"}
        for tag, host in (("sd", "sd"), ("pl", "pl")):
            job = c.job(ids[tag])
            assert job["hosts"][0][0] == host
            assert rows[host]["cpu_time"] == round(job["cpu_time"], 4) and job["cpu_time"] >= 0.4
            assert rows[host]["max_rss"] == job["max_rss"] >= 64 << 20
        history = _json(c, "hist", str(ids["sd"]))["jobs"][0]
        assert history["events"][-1]["data"]["cpu_time"] == c.job(ids["sd"])["cpu_time"]
    finally:
        close(c)
