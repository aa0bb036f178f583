#!/usr/bin/env python3
"""What one poll of `xce wait` costs the controller on a large wait (session 19).

    python bench/wait_cost.py [--arrays 4] [--size 10000] [--polls 5]

A throw-away cluster (bench/cluster.py) holds --arrays held arrays of --size elements (10,000 is the
largest an array may be), and one client asks `GET /jobs/wait` on all of them with a short timeout,
as each kind of waiter does: `-q` (the counts), plain `xce wait` (the counts, the failures' records,
the records of up to 20 jobs of their own: cli/waiting.py's Progress.QUERY) and `--json` or an old
client (every record). Prints the median round trip of each. The waits do not finish (the arrays are
held): each reply is one progress poll. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster import BenchCluster

from xce_lite.cli.waiting import Progress

KINDS = (("xce wait -q (counts)", {"brief": True}), ("xce wait (Progress.QUERY)", Progress.QUERY),
         ("every record", {}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=4)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    c = BenchCluster(slots=2)
    c.start()
    try:
        client = c.client()
        spec = dict(c.spec(["true"]), array=f"1-{args.size}", hold=True)
        ids = ",".join(str(client.post("/jobs", {"jobs": [spec]})["ids"][0]) for _ in range(args.arrays))
        print(f"{args.arrays} held arrays of {args.size}; median of {args.polls} polls each")
        for label, query in KINDS:
            took = []
            for _ in range(args.polls):
                t0 = time.perf_counter()
                reply = client.get("/jobs/wait", ids=ids, timeout=0.1, **query)
                took.append(time.perf_counter() - t0)
            print(f"  {label:28s} {1000 * statistics.median(took):8.0f} ms  ({len(reply.get('jobs', []))} records)")
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
