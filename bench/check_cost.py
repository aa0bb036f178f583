#!/usr/bin/env python3
"""What the jobs table's CHECK constraints cost per row written, and what the same rules cost written
without `IN (...)` lists (issue 18: most of an array's accept is SQLite writing its job rows).

    python bench/check_cost.py [--runs 7] [--rows 1000]

Two scratch databases in a temp directory (WAL, synchronous=FULL), each with only a `jobs` table:
the shipped one (the DDL a real store holds after every migration), and the same text with each
`state IN (...)` written as `state = 'A' OR state = 'B' ...` and each `state NOT IN (...)` as
`state <> 'A' AND ...` (the same rule: `state` is NOT NULL). Per run, the thread CPU time of one
executemany of --rows array-element rows (as store/newjobs.py writes them), then of one UPDATE per
row PEND -> DISP (as a dispatch writes it); and the shipped table written as store/newjobs.py
writes a submission's rows (multi-row INSERTs). Medians. Asserts nothing; changes no store.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import apsw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xce_lite.store.jobs import JobStore
from xce_lite.store.newjobs import insert_rows


def without_in_lists(ddl: str) -> str:
    def chain(match: re.Match) -> str:
        values = [v.strip() for v in match.group(2).split(",")]
        if match.group(1):
            return "(" + " AND ".join(f"state <> {v}" for v in values) + ")"
        return "(" + " OR ".join(f"state = {v}" for v in values) + ")"
    return re.sub(r"state (NOT )?IN \(([^()]*)\)", chain, ddl)


def measure(path: Path, ddl: str, runs: int, rows: int, multi: bool = False) -> tuple[float, float]:
    con = apsw.Connection(str(path))
    con.execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL")
    con.execute("CREATE TABLE arrays (id INTEGER PRIMARY KEY)")
    con.execute(ddl)
    inserts, updates, next_id = [], [], 1
    for _ in range(runs):
        batch = [(next_id + i, "alice", "normal", "PEND", "{}", 1, 1.0, None, "sweep", None, None, i + 1, None)
                 for i in range(rows)]
        con.execute("BEGIN IMMEDIATE")
        start = time.thread_time()
        if multi:  # as store/newjobs.py writes them
            insert_rows(con, "jobs(id, user, queue, state, spec, slots, submit_time, reason, name, depend, array_id, "
                             "array_index, project)", batch)
        else:
            con.executemany("INSERT INTO jobs(id, user, queue, state, spec, slots, submit_time, reason, name, depend, "
                            "array_id, array_index, project) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
        inserts.append(time.thread_time() - start)
        con.execute("COMMIT")
        con.execute("BEGIN IMMEDIATE")
        start = time.thread_time()
        con.executemany("UPDATE jobs SET state = 'DISP', hosts = '[[\"h\", 1]]', unit = 'u' WHERE id = ? "
                        "AND state = 'PEND'", [(row[0],) for row in batch])
        updates.append(time.thread_time() - start)
        con.execute("COMMIT")
        next_id += rows
    con.close()
    return statistics.median(inserts), statistics.median(updates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xce-checks-") as tmp:
        store = JobStore(Path(tmp) / "store.db")
        ddl = store._reader().execute("SELECT sql FROM sqlite_schema WHERE name = 'jobs'").get
        store.close()
        for n, (label, text, multi) in enumerate((("shipped CHECKs", ddl, False),
                                                  ("same rules, no IN lists", without_in_lists(ddl), False),
                                                  ("shipped, 500 rows/INSERT", ddl, True))):
            insert, update = measure(Path(tmp) / f"{n}.db", text, args.runs, args.rows, multi)
            print(f"{label:24s} insert {1e6 * insert / args.rows:6.2f} us/row, PEND->DISP update "
                  f"{1e6 * update / args.rows:6.2f} us/row  (median of {args.runs} runs of {args.rows} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
