"""A dispatch's effective values are encoded once per merge (issue 18): the plans of one merge share
one dict (controller/dispatching.py's memo), whose JSON, the largest text a dispatch writes, is
reused from tick to tick; a dict made anew is encoded anew; and every job's row holds its own
values, read back from a real store."""

from __future__ import annotations

import json

import pytest

from tests.support.store import T, spec
from xce_lite.store import transitions
from xce_lite.store.jobs import JobStore, Plan, TickWrites

EFFECTIVE = {"schema": 1, "app": "default", "profile_hash": "04b22bb4b9c8ef7e", "min_tasks": 1, "max_tasks": 1,
             "profile_env": {"A": "1"}, "hooks": {}, "retry": 0}


def test_one_merges_values_are_encoded_once_across_ticks(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[object] = []
    real_dumps = json.dumps

    def dumps(value, *args, **kwargs):
        encoded.append(value)
        return real_dumps(value, *args, **kwargs)

    monkeypatch.setattr(transitions.json, "dumps", dumps)
    ids = store.submit([(spec(), "normal")] * 5, "alice", T)
    merged, remerged = dict(EFFECTIVE), dict(EFFECTIVE, profile_env={"A": "2"})
    for i, effective in zip(ids, (merged, merged, merged, remerged, remerged)):
        store.record_tick(TickWrites(T + i, plans=[Plan(i, 1, [["h1", 1]], f"xce-t-{i}-1-0", None, effective)]))
    assert sum(1 for value in encoded if value is merged) == 1
    assert sum(1 for value in encoded if value is remerged) == 1
    assert [j.effective for j in store.jobs(ids)] == [merged] * 3 + [remerged] * 2
    # a dict of equal values made anew (a new merge) is its own: encoded, and stored as it is
    again = dict(EFFECTIVE)
    more, = store.submit([(spec(), "normal")], "alice", T)
    store.dispatch([Plan(more, 1, [["h1", 1]], "xce-t-x-1-0", None, again)], T + 9)
    assert sum(1 for value in encoded if value is again) == 1 and store.get(more).effective == EFFECTIVE
