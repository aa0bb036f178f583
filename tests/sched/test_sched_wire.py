"""The worker's pipe pickles hosts, placements and maps its own faster way (controller/sched_wire.py):
what arrives equals what was sent, and plain pickle (hashes, anything kept) is untouched."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

from xce_lite.controller import sched_wire  # noqa: F401  (registers the reducers, as the worker does)
from xce_lite.sched.core import Decisions, Dispatch, QueuePolicy, Snapshot
from xce_lite.sched.placement import HostView
from xce_lite.sched.reasons import FrozenMap, HostAlloc, Placement


def test_values_cross_the_pipe_equal_and_plain_pickle_keeps_their_own_form():
    host = HostView("h1", "ok", {"slots": 4, "mem": 8, "gpus": 2}, {"slots": 1, "mem": 2, "gpus": 1}, (1,),
                    {"type": "X86", "model": "a"}, ("avx",))
    alloc = HostAlloc("h1", 2, FrozenMap({"slots": 2, "mem": 4}), (0,))
    decisions = Decisions((Dispatch(7, Placement(7, (alloc,), FrozenMap({"lic": 1})), "hash"),),
                          (("reason", (8, 9)),), True)
    snapshot = Snapshot((host,), (), (QueuePolicy("normal"),), FrozenMap({"lic": 3}), (("normal", "u", 2),), 5.0)
    for value in (host, alloc, decisions, snapshot, FrozenMap({"b": 1, "a": 2})):
        wired = bytes(ForkingPickler.dumps(value))
        back = pickle.loads(wired)
        assert back == value and repr(back) == repr(value)  # the maps keep their order too
        assert b"sched_wire" in wired or not isinstance(value, (HostView, HostAlloc, FrozenMap, Decisions, Snapshot))
        assert b"sched_wire" not in pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
