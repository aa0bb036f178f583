"""Job arrays, pure: parsing index expressions and throttles, and refusing what cannot be one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_lite.errors import SpecError
from xce_lite.workflow import arrays
from xce_lite.workflow.arrays import MAX_ARRAY_SIZE, ArraySpec


@pytest.mark.parametrize("text, indices, throttle", [
    ("[1-5]", (1, 2, 3, 4, 5), None),
    ("[1-10:3]", (1, 4, 7, 10), None),
    ("[1,5,9-12]", (1, 5, 9, 10, 11, 12), None),
    ("[7]", (7,), None),
    ("[1-100]%10", tuple(range(1, 101)), 10),
    ("[3, 1]%1", (1, 3), 1),
    ("1-3", (1, 2, 3), None),
])
def test_parse_expands_ranges_steps_lists_and_throttle(text, indices, throttle):
    assert arrays.parse(text) == ArraySpec(indices, throttle)


@pytest.mark.parametrize("text, words", [
    ("[]", "has no index"),
    ("[10-1]", "ends before it starts; write 1-10"),
    ("[1-0]", "ends before it starts; it must end at 1 or more"),
    ("[0-4]", "from 1"),
    ("[1-5:0]", "step of 1-5:0 must be at least 1"),
    ("[1-5]%0", "throttle %0 must be a whole number of at least 1"),
    ("[1-5]%x", "throttle %x"),
    ("[a-b]", "'a-b' is not an index"),
    ("[1-3,2]", "index 2 is given twice"),
    (f"[1-{MAX_ARRAY_SIZE + 1}]", f"more than {MAX_ARRAY_SIZE} elements"),
    ("[1-999999999]", "from 1 to"),
    ("[1-500000,500001-999999]", f"more than {MAX_ARRAY_SIZE}"),
])
def test_bad_arrays_are_refused_with_what_to_fix(text, words):
    with pytest.raises(SpecError) as err:
        arrays.parse(text)
    assert words in str(err.value)


@pytest.mark.parametrize("text, name, suffix", [
    ("sims[1-20]%5", "sims", "[1-20]%5"),
    ("sims[3]", "sims", "[3]"),
    ("plain", "plain", None),
    ("a[b]c", "a[b]c", None),
])
def test_split_name_takes_the_index_part_off_a_job_name(text, name, suffix):
    assert arrays.split_name(text) == (name, suffix)


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(1, 300), min_size=1, max_size=60), st.one_of(st.none(), st.integers(1, 50)))
def test_text_then_parse_gives_the_array_back(indices, throttle):
    spec = ArraySpec(tuple(sorted(indices)), throttle)
    assert arrays.parse(spec.text()) == spec
