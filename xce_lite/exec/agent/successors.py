"""Queued successors (a part of the Agent, server.py; issue 18's "prefill"): a unit launched with
`after: PRED` while PRED runs here waits in the agent and starts the moment PRED ends, so that a
slot never waits for a round trip to the controller (HyperQueue assigns tasks beyond a worker's free
resources for the same reason).

Invariants: a queued unit is journaled (`queued`, with its whole launch request) before any reply
says "queued", so it survives an agent restart like any launch. It leaves the queue by exactly one
record: its `launched` (it starts, under unitops's rules: a unit runs at most once), or `dequeued`
(dropped: the lease ran out, or it was killed; a kill then records it `launched` and `finished`
with the kill's reason, never started). Nothing starts while the lease has lapsed: the queue is
dropped instead and the controller, told so, requeues the jobs after host_lost_after. A queued unit
is not in `units`: no process, no lease enforcement, no `list` status of its own (list's `queued`).

Chains (the controller's `prefill_depth` > 1): `after` may name a QUEUED unit too; a unit starts
when its predecessor is neither running nor queued here. A unit that leaves the queue unstarted
(`dequeued`: killed, withdrawn, refused at its start, dropped) is kept in `left` with its own
`after`, and a follower that names it (queued already, or launched later: a launch may cross a
kill on the wire) waits behind that one instead (`predecessor`), so a leaver never lets its
follower start beside the unit still running before it. No record of its own: journal.fold
derives `left` from each `dequeued` and the `queued` record it ends, in journal order, so a
restarted agent replays the same chains (a compaction writes each live entry as such a pair),
and a follower's request stays as it was sent (it names the leaver; the leaver queued again is
its predecessor again). An entry goes once what it points to neither runs nor waits here.
"""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from .lease import HostLease
    from .shared import AgentState
    from .state import UnitState
    from .unitops import UnitOps

import time

from .journal import record
from .jsonl import dumps
from .util import make_result
from .validate import Refused, validate

ENDING = ("TERM", "KILL", "INT", "HUP")  # signals that end a job: a queued one is then never started


class Successors:
    """The launch and signal requests as the queue sees them (the rest goes to `unit_ops`), and
    the queue's turn in the serve loop (`tend`): start what may start, drop all at the lease's end."""

    def __init__(self, state: AgentState, unit_state: UnitState, unit_ops: UnitOps, host_lease: HostLease):
        self.state, self.unit_state, self.unit_ops, self.host_lease = state, unit_state, unit_ops, host_lease

    def op_launch(self, req: dict) -> dict:
        """unitops.op_launch, but a unit with `after` naming a unit that runs here is queued behind
        it (reply status "queued"); one queued already is adopted ("queued" again)."""
        ops = self.unit_ops
        self.unit_state.catch_up()
        forks: list[tuple[str, dict, float, dict]] = []
        units = req.get("units", [])
        replies: list = [None] * len(units)
        for index in chain_order(units):  # a chain's units in one request: each after its predecessor
            u = units[index]
            reply = self.queue_one(u) if isinstance(u, dict) else None
            replies[index] = reply if reply is not None else ops.launch_one(u, forks)
        if forks:
            ops.fork_supervisors(forks)
        return {"replies": replies}

    def predecessor(self, after: object) -> str | None:
        """The unit a successor launched `after` waits behind: `after`, or, if that one left the
        queue unstarted, the one it waited behind, and so on (`left`); None: not a name."""
        if not isinstance(after, str):
            return None
        s = self.state
        for _ in range(len(s.left) + 1):  # (a chain of leavers is never circular: bounded anyway)
            if after in s.queued or self.running(after) or after not in s.left:
                break
            after = s.left[after]
        return after

    def running(self, name: str) -> bool:
        unit = self.state.units.get(name)
        return unit is not None and unit.result is None

    def waits(self, after: object) -> bool:
        """Whether a successor launched `after` must wait: its predecessor runs or is queued here."""
        pred = self.predecessor(after)
        return pred is not None and (pred in self.state.queued or self.running(pred))

    def queue_one(self, u: dict) -> dict | None:
        """The reply for `u` if it is (or stays) queued, else None: launch it as any unit."""
        s = self.state
        name, after = u.get("unit"), u.get("after")
        if isinstance(name, str) and name in s.queued:
            return {"unit": name, "status": "queued", "start_time": None, "error": None,
                    "after": s.queued[name].get("after")}
        if after is None or name in s.units:
            return None  # not a successor, or launched already: unitops adopts it
        if not self.waits(after):
            return None  # its predecessor ended (or was never here): it starts at once
        reply = {"unit": name, "status": "refused", "start_time": None, "error": None}
        try:
            validate(u, s.mode)  # refused now, not when its predecessor ends
        except Refused as exc:
            reply["error"] = str(exc)
            return reply
        lapsed = self.host_lease.lease_lapsed()
        if lapsed is not None:
            reply["error"] = lapsed
            return reply
        try:
            self.unit_state.append(record("queued", unit=name, spec=u))
        except OSError as exc:
            reply["error"] = f"cannot write {s.journal_path}: {exc.strerror}; check the spool's file system"
            return reply
        reply.update(status="queued", after=after)
        return reply

    def op_signal(self, req: dict) -> dict:
        """unitops.op_signal; a queued unit that is sent an ending signal leaves the queue and ends
        at once, never started, with the request's reason (its `finished` event follows)."""
        s = self.state
        unit = req.get("unit")
        if not (isinstance(unit, str) and unit in s.queued):
            return self.unit_ops.op_signal(req)
        if req.get("signal") not in ENDING:
            return {"found": False}  # nothing runs to stop or continue
        reason = str(req.get("reason") or "") or "killed"
        now = time.time()
        result = make_result(now, reason)
        result.update(start_time=None, mode=s.mode)  # never started
        self.unit_state.append(
            record("dequeued", unit=unit, reason=reason) + record("launched", unit=unit, start_time=None)
            + record("finished", unit=unit, result=result), sync=True)
        self.unit_state.emit_finished(unit, result)
        return {"found": True}

    def op_withdraw(self, req: dict) -> dict:
        """Drop a queued unit unstarted, for the controller to place its job elsewhere (a withdrawal).
        Whichever comes first, this or its start, decides: dropped -> `dequeued` (fdatasync'ed) and
        an `unqueued` event status "withdrawn"; started already (or unknown here) -> withdrawn false,
        and the `unqueued` event that said it started stands. One whose predecessor's end is known
        by now is started first, not withdrawn: its slot is free here (no round trip lost)."""
        s = self.state
        self.unit_state.catch_up()
        self.tend()
        unit = req.get("unit")
        if not (isinstance(unit, str) and unit in s.queued):
            return {"withdrawn": False}
        self.unit_state.append(record("dequeued", unit=unit, reason="withdrawn"), sync=True)
        s.out.append(dumps({"event": "unqueued", "unit": unit, "status": "withdrawn", "start_time": None,
                            "error": None}))
        return {"withdrawn": True}

    def tend(self) -> None:
        """Once per loop turn, before the turn's lines go out (so a predecessor's `finished` and its
        successor's `unqueued` travel together): at the lease's end drop the queue; else start each
        queued unit whose predecessor is neither running nor queued (again after a refusal: its
        follower's predecessor is then the refused unit's own)."""
        s = self.state
        if s.left:
            self.prune()
        if not s.queued:
            return
        lapsed = self.host_lease.lease_lapsed()
        if lapsed is not None:
            self.drop(self.in_chain_order(), f"dropped from the queue: {lapsed}")
            return
        while True:
            # a link of a chain, queued behind a unit that is itself queued, waits (`predecessor` stops
            # there): one lookup for it; only a chain's head is asked `waits` (512 queued units at
            # depth 8 on 64 slots, at each turn)
            queued = s.queued
            ready = [(name, spec) for name, spec in queued.items()
                     if not (type(after := spec.get("after")) is str and after in queued) and not self.waits(after)]
            if not ready:
                return
            forks: list[tuple[str, dict, float, dict]] = []
            replies = [self.unit_ops.launch_one(spec, forks) for _name, spec in ready]
            if forks:
                self.unit_ops.fork_supervisors(forks)
            refused = [reply["unit"] for reply in replies if reply["unit"] in s.queued]
            if refused:  # no `launched` record: it left the queue all the same, never started
                self.unit_state.append(b"".join(record("dequeued", unit=u, reason="refused") for u in refused))
            for reply in replies:
                s.out.append(dumps({"event": "unqueued", **reply}))
            if not refused:
                return

    def behind(self, units: set[str]) -> dict[str, int]:
        """How many queued units wait in the chain behind each of `units` (each link's `after`
        followed, in one pass over the queue and then along each chain: the agent's turn asks this
        with hundreds queued on a large host). A unit named by two followers (a launch that crossed
        a kill) counts one of them: never more than wait."""
        queued = self.state.queued
        follower = {after: name for name, spec in queued.items() if type(after := spec.get("after")) is str}
        counts = {}
        for unit in units:
            count, link = 0, unit
            while link in follower and count < len(queued):
                link, count = follower[link], count + 1
            counts[unit] = count
        return counts

    def prune(self) -> None:
        """Forget the leavers whose chain leads to no unit that runs or waits here: a follower
        naming one starts at once, as it would behind that unit, which has ended."""
        s = self.state
        for name in [n for n in s.left if not self.waits(n)]:
            del s.left[name]

    def in_chain_order(self) -> list[str]:
        """The queued units, each after the one it waits behind (a relaunch in this order queues
        the chain again as it was)."""
        s = self.state
        names = list(s.queued)
        return [names[i] for i in chain_order([s.queued[name] for name in names])]

    def drop(self, units: list[str], reason: str) -> None:
        s = self.state
        self.unit_state.append(b"".join(record("dequeued", unit=u, reason=reason) for u in units), sync=True)
        for unit in units:
            s.out.append(dumps({"event": "unqueued", "unit": unit, "status": "dropped", "start_time": None,
                                "error": reason}))


def chain_order(units: list) -> list[int]:
    """The indices of `units` (launch requests), each after the one its `after` names among them;
    otherwise in their order."""
    index = {u["unit"]: i for i, u in enumerate(units) if isinstance(u, dict) and isinstance(u.get("unit"), str)}
    before = [index.get(u["after"]) if isinstance(u, dict) and isinstance(u.get("after"), str) else None
              for u in units]
    if all(i is None for i in before):
        return list(range(len(units)))
    out: list[int] = []
    seen: set[int] = set()
    for first in range(len(units)):
        path: list[int] = []
        i: int | None = first
        while i is not None and i not in seen:  # up its chain to a unit placed already (or none)
            seen.add(i)
            path.append(i)
            i = before[i]
        out.extend(reversed(path))
    return out
