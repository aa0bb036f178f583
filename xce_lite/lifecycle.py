"""The job state machine, pure: which event may move a job from which state, and to where.

The controller first asks `next_state` (which refuses an illegal pair with TransitionError), then
stores the change with a guarded UPDATE (`WHERE state = <the state it saw>`), then does what the new
state asks. Event kinds are the past-tense names the store's event table records.
"""

from __future__ import annotations

from xce_lite.errors import TransitionError
from xce_lite.models import DISP, DONE, EXIT, PEND, PSUSP, RUN, SSUSP, USUSP

# event kind -> {from state: to state}. `finished` goes to DONE or EXIT by outcome (see next_state).
TRANSITIONS: dict[str, dict[str, str]] = {
    "submitted": {"": PEND},
    "submitted_held": {"": PSUSP},
    "held": {PEND: PSUSP},
    "released": {PSUSP: PEND},
    "dispatched": {PEND: DISP},
    "started": {DISP: RUN},
    "launch_failed": {DISP: EXIT},
    "killed_pending": {PEND: EXIT, PSUSP: EXIT},
    # its dependency can never be satisfied (done(5) after 5 ended EXIT): cancelled
    "dependency_failed": {PEND: EXIT, PSUSP: EXIT},
    "finished": {DISP: DONE, RUN: DONE, USUSP: DONE, SSUSP: DONE},
    "lost": {DISP: EXIT, RUN: EXIT, USUSP: EXIT, SSUSP: EXIT},
    # back to the queue: the host was lost (the default policy), or by hand; a new attempt follows
    "requeued": {DISP: PEND, RUN: PEND, USUSP: PEND, SSUSP: PEND},
    "suspended": {RUN: USUSP},
    "resumed": {USUSP: RUN},
}
EVENT_KINDS = tuple(TRANSITIONS)


def next_state(state: str, event: str, succeeded: bool = True) -> str:
    """The state after `event` happens to a job in `state`; TransitionError if it cannot happen."""
    table = TRANSITIONS.get(event)
    if table is None:
        raise TransitionError(f"unknown event {event!r}")
    if state not in table:
        raise TransitionError(f"a job in state {state or 'none'} cannot be {event.replace('_', ' ')}")
    target = table[state]
    if event == "finished" and not succeeded:
        return EXIT
    return target
