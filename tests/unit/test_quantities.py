"""units.py: durations and sizes as users type them, and back.

Table tests pin the accepted forms (LSF's `[hours:]minutes` and `-M` in megabytes among them);
property tests check that formatting a whole-unit size gives back what the user typed.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xce_lite.errors import SpecError
from xce_lite.quantities import format_duration, format_size, parse_duration, parse_size

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4

# ---- parse_duration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        # LSF: a bare number is minutes, `h:m` is hours and minutes; minutes may exceed 59 (-W 210)
        ("90", 5400.0),
        ("210", 12600.0),
        ("1:30", 5400.0),
        ("0:45", 2700.0),
        ("12:00", 43200.0),
        # a number with a unit
        ("30s", 30.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1.5h", 5400.0),
        ("0.5s", 0.5),
        ("2H", 7200.0),
        ("10M", 600.0),
        # what the user's shell leaves around it
        (" 10m ", 600.0),
        ("10 m", 600.0),
    ],
)
def test_parse_duration_accepts_lsf_and_unit_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", " ", "abc", "m", "10x", "10min", "1:", ":30", "1:30:00", "1.5", "1:3.5", "1e3s", "ten", "10m5s",
     "-5", "-5m", "-1:30", "+5m", "5 minutes"],
)
def test_parse_duration_refuses_bad_forms_naming_value_and_accepted_forms(text: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_duration(text)
    message = str(caught.value)
    assert repr(text) in message
    # the accepted forms, with examples, so the user can retype it without the manual
    assert "[hours:]minutes" in message
    for example in ("30s", "10m", "2h", "1d"):
        assert example in message


@pytest.mark.parametrize("text", ["0", "00", "0:00", "0:0", "0s", "0.0h", "0m", "0d"])
def test_parse_duration_refuses_zero(text: str) -> None:
    with pytest.raises(SpecError, match="more than zero") as caught:
        parse_duration(text)
    assert repr(text) in str(caught.value)


def test_parse_duration_message_says_which_option_was_wrong() -> None:
    with pytest.raises(SpecError) as caught:
        parse_duration("soon", what="run limit (-W)")
    assert str(caught.value).startswith("run limit (-W) 'soon'")


@given(hours=st.integers(0, 10_000), minutes=st.integers(0, 10_000))
def test_parse_duration_hours_minutes_is_exact(hours: int, minutes: int) -> None:
    if hours == minutes == 0:
        with pytest.raises(SpecError):
            parse_duration(f"{hours}:{minutes:02d}")
    else:
        assert parse_duration(f"{hours}:{minutes:02d}") == hours * 3600 + minutes * 60


@given(st.text(max_size=20))
def test_parse_duration_returns_a_positive_number_or_raises_spec_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except SpecError:
        return
    assert seconds > 0


# ---- parse_size -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512M", 512 * MiB),
        ("4G", 4 * GiB),
        ("1.5G", 1536 * MiB),
        ("100K", 100 * KiB),
        ("1.5K", 1536),
        ("2T", 2 * TiB),
        ("64b", 64),
        ("64B", 64),
        # LSF's -M: a bare number is megabytes
        ("100", 100 * MiB),
        ("4000", 4000 * MiB),
        ("0.5", MiB // 2),
        # spellings people use
        ("4GB", 4 * GiB),
        ("512mb", 512 * MiB),
        ("4g", 4 * GiB),
        (" 4G ", 4 * GiB),
        ("4 G", 4 * GiB),
    ],
)
def test_parse_size_accepts(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", " ", "G", "abc", "4X", "4 GiB", "-1G", "+1G", "1e3M", "1,5G", "4G4", "4.G"])
def test_parse_size_refuses_bad_forms_naming_value_and_accepted_forms(text: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_size(text)
    message = str(caught.value)
    assert repr(text) in message
    assert "512M" in message and "4G" in message


@pytest.mark.parametrize("text", ["0", "0M", "0G", "0b", "0.0K", "0.4b"])
def test_parse_size_refuses_zero(text: str) -> None:
    with pytest.raises(SpecError, match="more than zero") as caught:
        parse_size(text)
    assert repr(text) in str(caught.value)


def test_parse_size_message_says_which_option_was_wrong() -> None:
    with pytest.raises(SpecError) as caught:
        parse_size("plenty", what="memory limit (-M)")
    assert str(caught.value).startswith("memory limit (-M) 'plenty'")


@given(st.text(max_size=20))
def test_parse_size_returns_a_positive_int_or_raises_spec_error(text: str) -> None:
    try:
        size = parse_size(text)
    except SpecError:
        return
    assert isinstance(size, int) and size > 0


# ---- format_duration / format_size --------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0:00:00"),
        (59, "0:00:59"),
        (60, "0:01:00"),
        (3725, "1:02:05"),
        (86400, "24:00:00"),
        (100 * 3600, "100:00:00"),  # hours are not folded into days
        (59.6, "0:01:00"),
        (5400.0, "1:30:00"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0B"),
        (1, "1B"),
        (1023, "1023B"),
        (KiB, "1K"),
        (1536, "1.5K"),
        (512 * MiB, "512M"),
        (1024 * MiB, "1G"),
        (4 * GiB, "4G"),
        (1536 * MiB, "1.5G"),
        (3 * TiB, "3T"),
        (2048 * TiB, "2048T"),  # T is the largest unit
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


@given(n=st.integers(1, 1023), unit=st.sampled_from("BKMG"))
def test_format_size_gives_back_a_whole_unit_size(n: int, unit: str) -> None:
    assert format_size(parse_size(f"{n}{unit}")) == f"{n}{unit}"


@given(n=st.integers(1, 10**6))
def test_format_size_gives_back_whole_terabytes(n: int) -> None:
    assert format_size(parse_size(f"{n}T")) == f"{n}T"


@given(n=st.integers(1, 1023), steps=st.integers(1, 3), unit=st.sampled_from("BKM"))
def test_format_size_picks_the_largest_whole_unit(n: int, steps: int, unit: str) -> None:
    units = "BKMGT"
    bigger = units[min(units.index(unit) + steps, len(units) - 1)]
    scale = 1024 ** (units.index(bigger) - units.index(unit))
    text = format_size(parse_size(f"{n * scale}{unit}"))
    assert text == f"{n}{bigger}"
    assert parse_size(text) == parse_size(f"{n * scale}{unit}")


@pytest.mark.parametrize("text, parse", [("9" * 400 + "s", parse_duration), ("9" * 400, parse_size),
                                         ("9" * 400 + "T", parse_size), ("99999999999h", parse_duration)])
def test_huge_values_are_refused_with_a_spec_error(text, parse):
    with pytest.raises(SpecError, match="too large"):
        parse(text)
