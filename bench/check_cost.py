#!/usr/bin/env python3
"""What the jobs table's CHECK constraints cost per row written, before migration 0012 (`state IN
(...)` lists) and after (the same rules as `=`/`<>` chains), and what a 1,000-element array's
accept writes to the WAL, page by page (issue 18: most of an array's accept is SQLite).

    python bench/check_cost.py [--runs 7] [--rows 1000]

CHECKs: two scratch databases in a temp directory (WAL, synchronous=FULL), each with only a `jobs`
table: its DDL as a store at schema 0011 holds it, and as a store made by this tree holds it. Per
run, the thread CPU time of one executemany of --rows array-element rows, then of one UPDATE per
row PEND -> DISP (as a dispatch writes it); then the same with the rows inserted as store/newjobs.py
inserts an array's elements (one INSERT ... SELECT over a JSON list of indices). Medians.

WAL: a real store (this tree's schema, three earlier arrays in it), one more --rows-element array
submitted through JobStore.submit as the controller does; the frames its commit appended to the
WAL, each page attributed to its table or index (dbstat), and the thread CPU time of the submit.
Deterministic counts, but for the CPU. Asserts nothing; changes no store.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import apsw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xce_lite.models import JobSpec
from xce_lite.store import db
from xce_lite.store.jobs import JobStore
from xce_lite.store.newjobs import _ELEMENTS
from xce_lite.store.newjobs import _JOBS as _COLUMNS
from xce_lite.store.workflows import NewJob


def jobs_ddl(path: Path, version: int | None) -> str:
    """The jobs table's DDL in a store at schema `version` (None: this tree's latest)."""
    con = apsw.Connection(str(path))
    for number, _name, sql in db.migrations()[:version]:
        con.execute("BEGIN; " + sql + f"; PRAGMA user_version={number}; COMMIT")
    ddl = con.execute("SELECT sql FROM sqlite_schema WHERE name = 'jobs'").get
    con.close()
    return ddl


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
        if multi:  # as store/newjobs.py writes an array's elements: one INSERT over a JSON list
            con.execute(_ELEMENTS, ("alice", "normal", "PEND", "{}", 1, 1.0, None, "sweep", None, None,
                                    "[" + ",".join(str(i + 1) for i in range(rows)) + "]", next_id))
        else:
            con.executemany(f"INSERT INTO {_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
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


def wal_pages(tmp: Path, rows: int) -> tuple[int, collections.Counter, float]:
    """(WAL bytes, pages by table or index, thread CPU seconds) of one `rows`-element array's submit."""
    path = tmp / "wal.db"
    store = JobStore(path)
    spec = JobSpec(argv=("true",), cwd="/tmp", name="acc", env={"PATH": "/usr/bin:/bin", "HOME": "/root"},
                   array=f"1-{rows}")
    array = NewJob(spec, "normal", tuple(range(1, rows + 1)))
    for _ in range(3):  # b-trees of some depth, as in a store that has been used
        store.submit([array], "alice", 1.0)
    con = apsw.Connection(str(path))
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    start = time.thread_time()
    store.submit([array], "alice", 2.0)
    cpu = time.thread_time() - start
    data = Path(f"{path}-wal").read_bytes()
    page = struct.unpack(">I", data[8:12])[0]
    owner = dict((pageno, name) for name, pageno in con.execute("SELECT name, pageno FROM dbstat"))
    pages = collections.Counter(owner.get(struct.unpack(">I", data[at:at + 4])[0], "?")
                                for at in range(32, len(data) - page - 23, 24 + page))
    con.close()
    store.close()
    return len(data), pages, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args(argv)
    print(f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="xce-checks-") as tmp_name:
        tmp = Path(tmp_name)
        old, new = jobs_ddl(tmp / "v11.db", 11), jobs_ddl(tmp / "latest.db", None)
        print("same DDL: this tree has no migration 0012" if old == new else "")
        for n, (label, text, multi) in enumerate((("0011 CHECKs (IN lists)", old, False),
                                                  ("this tree's CHECKs", new, False),
                                                  ("0011, one INSERT json_each", old, True),
                                                  ("this tree, one INSERT json_each", new, True))):
            insert, update = measure(tmp / f"{n}.db", text, args.runs, args.rows, multi)
            print(f"{label:32s} insert {1e6 * insert / args.rows:6.2f} us/row, PEND->DISP update "
                  f"{1e6 * update / args.rows:6.2f} us/row  (median of {args.runs} runs of {args.rows} rows)")
        size, pages, cpu = wal_pages(tmp, args.rows)
        print(f"\none {args.rows}-element array's submit: {size} WAL bytes, {sum(pages.values())} pages "
              f"({', '.join(f'{name} {n}' for name, n in pages.most_common())}); submit CPU {1e3 * cpu:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
