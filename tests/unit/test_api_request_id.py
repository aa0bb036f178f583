"""A submission's request id (api/client.py `new_request_id`): what the controller accepts, distinct
per call, and later ids sort later, so the controller's table of ids (keyed by the id, kept a day)
takes each new one beside the last instead of in a random page of it (branch post4)."""

from __future__ import annotations

import time

from xce_lite.api.client import new_request_id
from xce_lite.controller.handlers.submit import request_id_of


def test_request_ids_are_accepted_distinct_and_sort_in_the_order_they_were_made() -> None:
    made = []
    for _ in range(2000):
        made.append(new_request_id())
        if len(made) % 500 == 0:
            time.sleep(0.002)  # apart in time too, not only within one clock reading
    assert all(request_id_of({"request_id": rid}) == rid for rid in made)
    assert len(set(made)) == len(made)
    assert made == sorted(made)  # random ids (the old ones) sort in no such order
