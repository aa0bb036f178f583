"""How the controller rides out a store it cannot write: figures, no assertions.

    python bench/store_faults.py                 # 3 runs, lock held 15 s, 20 jobs ending meanwhile
    python bench/store_faults.py --runs 5 --hold 15 --jobs 40

Each run: a fresh controller (bench/cluster.py); `--jobs` jobs `sleep 1` are submitted and run; a
second process takes the store's write lock (`BEGIN IMMEDIATE`, Python's sqlite3) and holds it for
`--hold` seconds while those jobs end; once `controller status` names the problem, one `xce submit`
is tried (its exit code, and how long it took to be refused). Then the lock is let go, and the run
measures how long until every job is stored as ended (the controller carries on by itself). Printed
per run and as medians: when status named the problem, the refused submit (rc, s), the recovery
after the release (s), jobs lost (ended jobs not stored DONE), controller restarts (pid changes).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from cluster import BenchCluster, wait_done

HOLDER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("ROLLBACK")
"""


def one_run(hold: float, jobs: int) -> dict:
    c = BenchCluster(slots=max(2, jobs))
    try:
        c.start()
        client = c.client()
        ids = client.post("/jobs", {"jobs": [c.spec(["sleep", "1"]) for _ in range(jobs)]})["ids"]
        deadline = time.monotonic() + 60
        while any(j["state"] != "RUN" for j in client.get("/jobs", ids=",".join(map(str, ids)))["jobs"]):
            if time.monotonic() > deadline:
                raise RuntimeError("the jobs did not start within 60 s")
            time.sleep(0.05)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(c.home / "xce.db"), str(hold)],
                                  stdout=subprocess.PIPE, text=True)
        holder.stdout.readline()
        locked = time.monotonic()
        while not any(p["what"] == "store" for p in client.get("/status").get("problems", [])):
            time.sleep(0.05)
        noticed = time.monotonic() - locked
        began = time.monotonic()
        refused = c.xce("submit", "--", "true")
        refused_after = time.monotonic() - began
        holder.wait()
        holder.stdout.close()
        released = time.monotonic()
        reply = wait_done(client, ids, released + 120, brief=False)
        recovery = time.monotonic() - released
        stored = reply["jobs"] if reply else []
        lost = jobs - sum(1 for j in stored if j["state"] == "DONE")
        restarts = int(client.get("/status")["pid"] != c.pid)
        return {"noticed_s": noticed, "refused_rc": refused.returncode, "refused_s": refused_after,
                "recovery_s": recovery,
                "lost": lost, "restarts": restarts}
    finally:
        c.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hold", type=float, default=15.0, help="seconds the other process holds the lock")
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    results = []
    for n in range(args.runs):
        r = one_run(args.hold, args.jobs)
        results.append(r)
        print(f"run {n + 1}: status names the problem {r['noticed_s']:.1f} s after the lock was taken; a submit "
              f"then: rc {r['refused_rc']} after {r['refused_s']:.1f} s; "
              f"all {args.jobs} ends stored {r['recovery_s']:.2f} s after the release; lost {r['lost']}; "
              f"controller restarts {r['restarts']}", flush=True)
    print(f"median over {args.runs} run(s), lock held {args.hold:g} s, {args.jobs} jobs ending under it: "
          f"status names it after {statistics.median(r['noticed_s'] for r in results):.1f} s, "
          f"a submit then is refused in {statistics.median(r['refused_s'] for r in results):.1f} s (rc "
          f"{sorted({r['refused_rc'] for r in results})}), recovery "
          f"{statistics.median(r['recovery_s'] for r in results):.2f} s, lost {sum(r['lost'] for r in results)}, "
          f"restarts {sum(r['restarts'] for r in results)}")


if __name__ == "__main__":
    main()
