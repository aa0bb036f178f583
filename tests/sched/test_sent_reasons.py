"""SentReasons (sched/sent_reasons.py): what a receiver holds after taking only the deltas equals
what it would hold had it taken every session's reasons in full, through random sessions, jobs
that come and go, reasons the receiver asks for again and full resends. The groups are large and
mostly unchanged from one session to the next, as with a backlog, where `delta` checks a group
against what was told without building a set of its ids."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from xce_lite.sched.sent_reasons import SentReasons

REASONS = ("no slot free", "queue limit", "blocked: waits for job 1", "held")

steps = st.lists(st.tuples(
    st.sampled_from(("session", "session", "session", "forget", "clear")),
    st.lists(st.integers(0, 40), max_size=6),  # jobs that leave or join, or are asked for again
    st.lists(st.sampled_from(REASONS), min_size=41, max_size=41),  # each job's reason in this session
), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_receiver_holds_every_reason_of_the_last_session_whatever_was_left_out(script):
    sent = SentReasons()
    receiver: dict[int, str] = {}
    pending = set(range(0, 41, 2))
    for kind, ids, reasons in script:
        if kind == "clear":  # a full resend: the receiver may hold anything
            sent.clear()
            receiver = {job_id: "stale" for job_id in receiver}
        elif kind == "forget":  # jobs left or joined, or their reasons are asked for again
            pending ^= set(ids)
            sent.forget(ids)
            for job_id in ids:
                receiver[job_id] = "stale"
        else:
            order = sorted(pending, key=lambda job_id: (reasons[job_id], job_id))
            groups: dict[str, list[int]] = {}
            for job_id in order:
                groups.setdefault(reasons[job_id], []).append(job_id)
            waiting = tuple((reason, tuple(group)) for reason, group in groups.items())
            told = sent.delta(waiting)
            for reason, group in told:
                assert set(group) <= set(dict(waiting)[reason])
                assert list(group) == [j for j in dict(waiting)[reason] if j in group]  # same order
                receiver.update(dict.fromkeys(group, reason))
            assert {job_id: receiver.get(job_id) for job_id in pending} == \
                {job_id: reasons[job_id] for job_id in pending}
