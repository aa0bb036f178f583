"""Hypothesis round trips of the `-R` language over ResReq values built directly (not only over
strings): format then parse, pickling, combine, and any text parses or fails with its column."""

from __future__ import annotations

import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xce_lite.sched import resreq as rr
from xce_lite.sched.resreq import (
    And,
    Compare,
    Defined,
    Name,
    Not,
    Number,
    Or,
    OrderKey,
    ResReq,
    ResReqError,
    RusageTerm,
    Span,
    String,
)

# ---------------------------------------------------------------- properties

names_st = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(
    lambda s: s.lower() not in rr.RESERVED_WORDS)
units_st = st.sampled_from([None, *rr.UNIT_POWERS])
finite_st = st.floats(allow_nan=False, allow_infinity=False)
numbers_st = st.builds(Number, st.integers(-10**30, 10**30) | finite_st, units_st)
leaves_st = st.one_of(
    st.builds(Name, names_st),
    st.builds(Defined, names_st),
    st.builds(Compare, st.sampled_from(rr.COMPARE_OPS), st.builds(Name, names_st), numbers_st),
    st.builds(Compare, st.sampled_from(["==", "!="]), st.builds(Name, names_st),
              st.builds(String, st.text())),
)
exprs_st = st.recursive(leaves_st, lambda sub: st.one_of(
    st.builds(Not, sub),
    st.builds(And, st.lists(sub, min_size=2, max_size=4).map(tuple)),
    st.builds(Or, st.lists(sub, min_size=2, max_size=4).map(tuple)),
), max_leaves=12)
counts_st = st.none() | st.integers(1, 10**6)
spans_st = st.just(Span(one_host=True)) | st.tuples(counts_st, counts_st, st.booleans()).filter(
    lambda t: t[0] or t[1]).map(
    lambda t: Span(ptile=t[0], max_hosts=t[1]) if t[2] else Span(block=t[0], max_hosts=t[1]))
rusage_st = st.builds(
    RusageTerm, names_st.filter(lambda s: s.lower() not in rr.UNSUPPORTED_RUSAGE_KEYS),
    st.integers(0, 10**20) | st.floats(min_value=0, allow_nan=False, allow_infinity=False), units_st,
    st.sampled_from(rr.PER_VALUES))
resreqs_st = st.builds(
    ResReq,
    select=st.none() | exprs_st,
    order=st.lists(st.builds(OrderKey, names_st, st.booleans()), max_size=4,
                   unique_by=lambda k: k.name).map(tuple),
    rusage=st.lists(rusage_st, max_size=4, unique_by=lambda t: t.name).map(tuple),
    span=st.none() | spans_st,
    same=st.lists(names_st, max_size=3, unique=True).map(tuple),
)


PROPERTY = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(resreqs_st)
def test_format_then_parse_gives_the_same_value(r: ResReq) -> None:
    text = rr.format(r)
    assert rr.parse(text) == r
    assert rr.format(rr.parse(text)) == text


@PROPERTY
@given(resreqs_st)
def test_values_pickle_and_hash(r: ResReq) -> None:
    copy = pickle.loads(pickle.dumps(r))
    assert copy == r and hash(copy) == hash(r)


@PROPERTY
@given(st.lists(resreqs_st, max_size=3))
def test_combine_of_one_is_identity_and_result_round_trips(reqs: list) -> None:
    if reqs:
        assert rr.combine(reqs[:1]) == reqs[0]
    try:
        merged = rr.combine(reqs)
    except ResReqError as error:
        assert "-R #" in str(error)
        return
    assert rr.parse(rr.format(merged)) == merged
    assert rr.names(merged) == set().union(*(rr.names(r) for r in reqs))


FRAGMENTS = ["select[", "order[", "rusage[", "span[", "same[", "]", "[", "mem", "type", ">", "<=", "=", "==",
             "!=", "4G", "0.5", "-", "+", "&&", "||", "!", "(", ")", "and", "not", "defined(", '"x y"', "'",
             ",", ":", " ", "/host", "/job", "ptile=", "hosts=", "maxhosts=", "block=", "1", "X86_64", "cu["]


@PROPERTY
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join) | st.text(max_size=30))
def test_any_text_parses_or_fails_with_a_located_message(text: str) -> None:
    try:
        r = rr.parse(text)
    except ResReqError as error:
        assert error.position is not None and 1 <= error.position <= len(text) + 1
        assert str(error).startswith(f'-R "{text}": at column {error.position}: expected')
        return
    assert rr.parse(rr.format(r)) == r
