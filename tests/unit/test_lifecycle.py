"""lifecycle.py: the job state machine.

The legal transitions are written out here by hand, not derived from `TRANSITIONS`: a transition
added to the code must be added to this table too, on purpose.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xce_lite.errors import TransitionError
from xce_lite.lifecycle import EVENT_KINDS, TRANSITIONS, next_state
from xce_lite.models import DISP, DONE, EXIT, FINISHED_STATES, PEND, PSUSP, RUN, SSUSP, STATES, USUSP

NO_JOB = ""  # the state before `submitted`

# (from state, event, succeeded) -> to state
LEGAL: dict[tuple[str, str, bool], str] = {
    (NO_JOB, "submitted", True): PEND,
    (NO_JOB, "submitted_held", True): PSUSP,
    (PEND, "held", True): PSUSP,
    (PSUSP, "released", True): PEND,
    (PEND, "dispatched", True): DISP,
    (DISP, "started", True): RUN,
    (DISP, "launch_failed", True): EXIT,
    (PEND, "killed_pending", True): EXIT,
    (PSUSP, "killed_pending", True): EXIT,
    (PEND, "dependency_failed", True): EXIT,
    (PSUSP, "dependency_failed", True): EXIT,
    (DISP, "finished", True): DONE,
    (RUN, "finished", True): DONE,
    (USUSP, "finished", True): DONE,
    (SSUSP, "finished", True): DONE,
    (DISP, "finished", False): EXIT,
    (RUN, "finished", False): EXIT,
    (USUSP, "finished", False): EXIT,
    (SSUSP, "finished", False): EXIT,
    (DISP, "lost", True): EXIT,
    (RUN, "lost", True): EXIT,
    (USUSP, "lost", True): EXIT,
    (SSUSP, "lost", True): EXIT,
    (DISP, "requeued", True): PEND,
    (RUN, "requeued", True): PEND,
    (USUSP, "requeued", True): PEND,
    (SSUSP, "requeued", True): PEND,
    (RUN, "suspended", True): USUSP,
    (USUSP, "resumed", True): RUN,
}
LEGAL_PAIRS = {(state, event) for state, event, _ in LEGAL}
ALL_STATES = (NO_JOB, *STATES)


@pytest.mark.parametrize(("state", "event", "succeeded", "target"),
                         [(*key, target) for key, target in LEGAL.items()])
def test_legal_transition(state: str, event: str, succeeded: bool, target: str) -> None:
    assert next_state(state, event, succeeded=succeeded) == target


def test_the_table_above_is_every_transition_the_code_allows() -> None:
    assert set(EVENT_KINDS) == set(TRANSITIONS)
    assert {(state, event) for event, table in TRANSITIONS.items() for state in table} == LEGAL_PAIRS


@pytest.mark.parametrize("event", ["lost", "launch_failed", "killed_pending", "started", "dispatched", "requeued",
                                   "suspended", "resumed"])
def test_the_outcome_only_matters_to_finished(event: str) -> None:
    for state in ALL_STATES:
        if (state, event) in LEGAL_PAIRS:
            assert next_state(state, event, succeeded=False) == LEGAL[(state, event, True)]


ILLEGAL = [(s, e) for s, e in itertools.product(ALL_STATES, EVENT_KINDS) if (s, e) not in LEGAL_PAIRS]


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_illegal_pair_is_refused(state: str, event: str) -> None:
    for succeeded in (True, False):
        with pytest.raises(TransitionError) as caught:
            next_state(state, event, succeeded=succeeded)
        message = str(caught.value)
        assert (state or "none") in message
        assert event.replace("_", " ") in message


@pytest.mark.parametrize("state", sorted(FINISHED_STATES))
def test_finished_jobs_accept_no_event(state: str) -> None:
    for event in EVENT_KINDS:
        with pytest.raises(TransitionError):
            next_state(state, event)


@pytest.mark.parametrize("event", ["exploded", "", "FINISHED", "submitted "])
def test_unknown_event_is_refused_by_name(event: str) -> None:
    with pytest.raises(TransitionError, match="unknown event") as caught:
        next_state(PEND, event)
    assert repr(event) in str(caught.value)


def test_no_event_leads_back_to_no_job() -> None:
    assert all(target in STATES for table in TRANSITIONS.values() for target in table.values())


events = st.lists(
    st.tuples(st.sampled_from((*EVENT_KINDS, "bogus")), st.booleans()),
    max_size=60,
)


@given(start=st.sampled_from(ALL_STATES), steps=events)
def test_random_event_sequences_stay_in_known_states_and_finished_is_final(
    start: str, steps: list[tuple[str, bool]]
) -> None:
    state = start
    for event, succeeded in steps:
        try:
            after = next_state(state, event, succeeded=succeeded)
        except TransitionError:
            continue  # refused: the job stays where it was
        assert after in STATES, f"{state} --{event}--> {after!r}"
        assert state not in FINISHED_STATES, f"a {state} job moved to {after} on {event}"
        assert (state, event) in LEGAL_PAIRS
        state = after
