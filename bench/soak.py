"""Soak: kill -9 the controller at random moments under load, restart it, and count what the
promises say must never happen. Prints figures; asserts nothing (exit 1 if a promise broke).

    python bench/soak.py                  # 200 kills, bounded by --max-minutes (default 40)
    python bench/soak.py --kills 20 --clients 2

Load: `--clients` threads, each with its own connection, submit without pause but for a little
backpressure (a single job, an array of 3, or a batch of two jobs per request, each request with
a request id, as `xce submit` sends); every tenth job runs 1 s, so that kills find jobs running.
Each job's body appends "JOBID ATTEMPT" to a ledger. A killer sleeps a random 0.2-2 s, sends
SIGKILL to the controller, and restarts it (`xce controller start`); every other kill is aimed
at a submission in flight (0-6 ms after a client starts sending one), so that many are cut off
before, during and after their commit.

A submission can end four ways: acknowledged; refused before it was sent (nothing stored);
cut off after it was sent, then asked again with the same request id (the client library does it
once, when the controller answers again) and acknowledged; or cut off with no answer to the retry
either (its outcome unknown to the client). Every request names its jobs uniquely, so the store
says how many copies each left.

At the end (no more kills): wait for every acknowledged job to finish, stop the controller, open
the store and print: acknowledged / stored / lost; ran twice (an id in the ledger twice) and the
same attempt twice; acknowledged but never ran; cut-off requests and how many jobs each left;
duplicated requests; `PRAGMA integrity_check`.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import BenchCluster, wait_done

from xce_lite import errors
from xce_lite.api.client import Client, ReplyLost, new_request_id
from xce_lite.store.jobs import JobStore


class Tally:
    """What the clients saw, shared by their threads."""

    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.acked: list[int] = []  # job ids (array elements expanded)
        self.names: dict[str, str] = {}  # job or array name -> how its request ended
        self.outcomes: Counter[str] = Counter()
        self.sending = threading.Event()  # set by a client as it sends a submission (aimed kills wait for it)


def client_loop(bench: BenchCluster, number: int, ledger: Path, tally: Tally, stop: threading.Event,
                rng: random.Random) -> None:
    api = Client(bench.socket, timeout=10)
    sent = 0
    while not stop.is_set():
        sent += 1
        kind = rng.choices(("single", "array", "batch"), (7, 2, 2))[0]
        tags = [f"c{number}-{sent}-{i}" for i in range(2 if kind == "batch" else 1)]
        specs = []
        for i, tag in enumerate(tags):
            slow = (sent + i) % 10 == 0
            body = f'echo "$XCE_JOBID $XCE_ATTEMPT" >> {ledger}' + ("; sleep 1" if slow else "")
            spec = bench.spec(["sh", "-c", body], name=tag)
            if kind == "array":
                spec["array"] = "1-3"
            specs.append(spec)
        cut = []
        request = {"jobs": specs, "request_id": new_request_id()}
        tally.sending.set()
        try:
            reply = api.submit(request, on_retry=cut.append, wait=15)
        except ReplyLost:
            outcome = "unknown: lost, and the retry's reply lost too"
        except errors.ControllerDown:
            outcome = "unknown: lost, no answer to the retry" if cut else "refused: not sent"
        except errors.XceError as err:
            outcome = f"error: {err}"
        else:
            outcome = "acknowledged"
            if cut:  # "repeated": the first try had stored it before its reply was lost
                outcome = ("cut off, retried: answered with the jobs the first try stored" if reply.get("repeated")
                           else "cut off, retried: stored by the retry")
            ids = [job_id + k for job_id, size in zip(reply["ids"], reply["sizes"]) for k in range(size or 1)]
            with tally.mu:
                tally.acked.extend(ids)
        with tally.mu:
            tally.outcomes[outcome] += 1
            for tag in tags:
                tally.names[tag] = outcome
        if outcome.startswith("refused") or outcome.startswith("unknown"):
            time.sleep(0.1)
        elif sent % 20 == 0:
            try:  # backpressure: the queue stays short enough to drain at the end
                while api.get("/status")["jobs"]["pending"] > 150 and not stop.is_set():
                    time.sleep(0.5)
            except errors.XceError:
                pass
    api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-minutes", type=float, default=40.0, help="stop killing after this long")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    bench = BenchCluster(slots=4)
    ledger = bench.work / "ledger"
    tally, stop = Tally(), threading.Event()
    started = time.monotonic()
    kills = 0
    try:
        bench.start()
        clients = [threading.Thread(target=client_loop,
                                    args=(bench, n, ledger, tally, stop, random.Random(rng.random())))
                   for n in range(args.clients)]
        for thread in clients:
            thread.start()
        while kills < args.kills and time.monotonic() - started < args.max_minutes * 60:
            time.sleep(rng.uniform(0.2, 2.0))
            if kills % 2:  # every other kill is aimed: a few ms after a client starts a submission
                tally.sending.clear()
                if tally.sending.wait(2.0):
                    time.sleep(rng.uniform(0.0, 0.006))
            bench.remember_children()
            os.kill(bench.pid, signal.SIGKILL)
            kills += 1
            for attempt in range(3):
                try:
                    bench.start()
                    break
                except RuntimeError as err:
                    print(f"restart {attempt + 1} after kill {kills} failed: {err}", file=sys.stderr)
            else:
                print("the controller does not start any more: stopping", file=sys.stderr)
                break
            if kills % 20 == 0:
                print(f"{kills} kills, {len(tally.acked)} jobs acknowledged, {time.monotonic() - started:.0f} s",
                      flush=True)
        stop.set()
        for thread in clients:
            thread.join()
        load_seconds = time.monotonic() - started
        with tally.mu:
            acked = sorted(set(tally.acked))
        deadline = time.monotonic() + 900
        all_finished = all(wait_done(bench.client(), acked[i:i + 1000], deadline) is not None
                           for i in range(0, len(acked), 1000))
        bench.xce("controller", "stop", timeout=60)
        return report(bench, ledger, tally, acked, all_finished, kills, load_seconds, seed, args)
    finally:
        stop.set()
        bench.stop()


def report(bench: BenchCluster, ledger: Path, tally: Tally, acked: list[int], all_finished: bool, kills: int,
           load_seconds: float, seed: int, args: argparse.Namespace) -> int:
    store = JobStore(bench.home / "xce.db", readonly=True)
    try:
        every = store.jobs(None, include_finished=True)
        integrity = store.integrity(full=True)
        # prefill (controller/prefilling.py): how many jobs waited queued behind another on its host
        # (a dispatch that says so), and how many of those were withdrawn to room elsewhere
        histories = [store.events(job.id) for job in every]
        queued = sum(any(kind == "dispatched" and data and "queued" in data for _t, kind, data in h)
                     for h in histories)
        withdrawn = sum(any(kind == "requeued" and "withdrawn" in str(data) for _t, kind, data in h)
                        for h in histories)
    finally:
        store.close()
    stored_ids = {job.id for job in every}
    by_id = {job.id: job for job in every}
    lost = [i for i in acked if i not in stored_ids]
    lines = [line.split() for line in ledger.read_text().splitlines()] if ledger.exists() else []
    runs = Counter(int(job_id) for job_id, _attempt in lines)
    attempts = Counter((int(job_id), attempt) for job_id, attempt in lines)
    ran_twice = sorted(i for i, n in runs.items() if n > 1)
    same_attempt_twice = sorted(key for key, n in attempts.items() if n > 1)
    never_ran = [i for i in acked if i not in runs and by_id.get(i) is not None and by_id[i].state == "DONE"]
    copies: Counter[str] = Counter()  # a request's job or array name -> how many it left stored
    arrays_seen: set[tuple[str, int]] = set()
    for job in every:
        name = job.spec.name or ""
        if job.array_id is None:
            copies[name] += 1
        elif (name, job.array_id) not in arrays_seen:
            arrays_seen.add((name, job.array_id))
            copies[name] += 1
    cut = [tag for tag, how in tally.names.items() if how.startswith("cut off")]
    unknown = [tag for tag, how in tally.names.items() if how.startswith("unknown")]
    refused = [tag for tag, how in tally.names.items() if how.startswith("refused")]
    duplicated = sorted(tag for tag, n in copies.items() if n > 1)
    print(f"\nsoak: {kills} kills of the controller (kill -9) in {load_seconds:.0f} s, {args.clients} clients, "
          f"seed {seed}")
    for outcome, n in sorted(tally.outcomes.items()):
        print(f"  requests {outcome}: {n}")
    print(f"  acknowledged jobs:                 {len(acked)}")
    print(f"  stored:                            {len(acked) - len(lost)}")
    print(f"  lost:                              {len(lost)}")
    print(f"  ran twice (an id twice in ledger): {len(ran_twice)}")
    print(f"  same attempt twice:                {len(same_attempt_twice)}")
    print(f"  acknowledged, DONE, never ran:     {len(never_ran)}")
    print(f"  all acknowledged jobs finished:    {'yes' if all_finished else 'NO (timed out)'}")
    print(f"  cut off mid-submit, retried:       {len(cut)} jobs/arrays; each left "
          f"{sorted(Counter(copies[t] for t in cut).items())} (copies, count)")
    print(f"  cut off, retry unanswered:         {len(unknown)}; stored copies "
          f"{sorted(Counter(copies[t] for t in unknown).items())} (copies, count)")
    print(f"  refused before sending, stored:    {sum(copies[t] for t in refused)} (of {len(refused)})")
    print(f"  requests that left two copies:     {len(duplicated)}")
    print(f"  PRAGMA integrity_check:            {integrity}")
    print(f"  queued behind a job (prefill):     {queued} jobs; withdrawn to free room: {withdrawn}")
    broken = (lost or ran_twice or same_attempt_twice or never_ran or duplicated or integrity != "ok"
              or any(copies[t] != 1 for t in cut) or sum(copies[t] for t in refused) or not all_finished)
    print("  promises: " + ("BROKEN" if broken else "kept"))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
