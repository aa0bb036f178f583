"""Tests of the `-R` resource requirement language, read and written: a table per section, the
canonical form, and every error with its column."""

from __future__ import annotations

import pickle

import pytest

from tests.support.resreq import A, B, C, D, eq, gt, select
from xce_lite.errors import SpecError
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

# ---------------------------------------------------------------- select


@pytest.mark.parametrize("text, expected", [
    ("a", A),
    ("a && b", And((A, B))),
    ("a || b", Or((A, B))),
    ("!a", Not(A)),
    ("!!a", Not(Not(A))),
    ("defined(gpu)", Defined("gpu")),
    ("mem>4", gt("mem", 4)),
    ("mem = 4", Compare("==", Name("mem"), Number(4))),
    ("mem==4", Compare("==", Name("mem"), Number(4))),
    ("mem!=4", Compare("!=", Name("mem"), Number(4))),
    ("mem<4", Compare("<", Name("mem"), Number(4))),
    ("mem<=4", Compare("<=", Name("mem"), Number(4))),
    ("mem>=4", Compare(">=", Name("mem"), Number(4))),
    ("temp>-5", gt("temp", -5)),
    ("temp >= -0.5", Compare(">=", Name("temp"), Number(-0.5))),
    # The resource goes on the left; the operator turns around with it.
    ("4<mem", gt("mem", 4)),
    ("4<=mem", Compare(">=", Name("mem"), Number(4))),
    ("4==mem", Compare("==", Name("mem"), Number(4))),
    ('"X86_64"==type', eq("type", "X86_64")),
    # Bare words on the right are strings; both quote kinds; escapes.
    ("type==X86_64", eq("type", "X86_64")),
    ('model=="EPYC 7"', eq("model", "EPYC 7")),
    ("model=='EPYC 7'", eq("model", "EPYC 7")),
    ('model!="a\\"b\\\\c"', Compare("!=", Name("model"), String('a"b\\c'))),
    ('model==""', eq("model", "")),
    ('model=="]) && x"', eq("model", "]) && x")),
    # Precedence: ! > comparisons > && > ||.
    ("a || b && c", Or((A, And((B, C))))),
    ("a && b || c && d", Or((And((A, B)), And((C, D))))),
    ("(a || b) && c", And((Or((A, B)), C))),
    ("!a && b", And((Not(A), B))),
    ("!(a || b)", Not(Or((A, B)))),
    ("!(mem>4)", Not(gt("mem", 4))),
    ("!defined(a) || b", Or((Not(Defined("a")), B))),
    # Words, any case, mean the same as the symbols.
    ("a and b or not c", Or((And((A, B)), Not(C)))),
    ("a AND b Or NOT c", Or((And((A, B)), Not(C)))),
    ("DEFINED(a)", Defined("a")),
    # Flattened, so grouping of one operator does not matter.
    ("a && (b && c)", And((A, B, C))),
    ("(a || b) || (c || d)", Or((A, B, C, D))),
    ("((a))", A),
    ("  mem  >  4G  &&\tb ", And((gt("mem", 4, "G"), B))),
])
def test_select(text: str, expected: object) -> None:
    assert select(text) == expected


@pytest.mark.parametrize("literal, expected", [
    ("4", Number(4)), ("4k", Number(4, "K")), ("4K", Number(4, "K")), ("4KB", Number(4, "K")),
    ("4kb", Number(4, "K")), ("4M", Number(4, "M")), ("4g", Number(4, "G")), ("4GB", Number(4, "G")),
    ("4.5t", Number(4.5, "T")), ("512b", Number(512, "B")), (".5G", Number(0.5, "G")),
    ("4.", Number(4.0)), ("007", Number(7)),
])
def test_units(literal: str, expected: Number) -> None:
    assert select(f"mem>{literal}") == Compare(">", Name("mem"), expected)


def test_numbers_keep_int_or_float() -> None:
    assert type(select("x>4").right.value) is int  # type: ignore[union-attr]
    assert type(select("x>4.0").right.value) is float  # type: ignore[union-attr]


# ---------------------------------------------------------------- other sections


@pytest.mark.parametrize("text, expected", [
    ("order[-mem slots]", (OrderKey("mem", True), OrderKey("slots"))),
    ("order[r15s:pg]", (OrderKey("r15s"), OrderKey("pg"))),
    ("order[+mem, -slots]", (OrderKey("mem"), OrderKey("slots", True))),
    ("order[ a , b:c  d ]", (OrderKey("a"), OrderKey("b"), OrderKey("c"), OrderKey("d"))),
])
def test_order(text: str, expected: tuple) -> None:
    assert rr.parse(text) == ResReq(order=expected)


@pytest.mark.parametrize("text, expected", [
    ("rusage[mem=4G/host, lic_matlab=1/job]",
     (RusageTerm("lic_matlab", 1, None, "job"), RusageTerm("mem", 4, "G", "host"))),
    ("rusage[mem=4G/task]", (RusageTerm("mem", 4, "G"),)),
    ("rusage[mem=4G]", (RusageTerm("mem", 4, "G", "task"),)),
    ("rusage[mem=0]", (RusageTerm("mem", 0),)),
    ("rusage[mem=20:swp=50]", (RusageTerm("mem", 20), RusageTerm("swp", 50))),
    ("rusage[ mem = 1.5gb / host ]", (RusageTerm("mem", 1.5, "G", "host"),)),
])
def test_rusage(text: str, expected: tuple) -> None:
    assert rr.parse(text) == ResReq(rusage=expected)


@pytest.mark.parametrize("text, expected", [
    ("span[ptile=4]", Span(ptile=4)),
    ("span[hosts=1]", Span(one_host=True)),
    ("span[block=2]", Span(block=2)),
    ("span[maxhosts=3]", Span(max_hosts=3)),
    ("span[ptile=4:maxhosts=2]", Span(ptile=4, max_hosts=2)),
    ("span[maxhosts=2, ptile=4]", Span(ptile=4, max_hosts=2)),
    ("span[block=2,maxhosts=3]", Span(block=2, max_hosts=3)),
    ("span[ptile=04]", Span(ptile=4)),
])
def test_span(text: str, expected: Span) -> None:
    assert rr.parse(text) == ResReq(span=expected)


@pytest.mark.parametrize("text, expected", [
    ("same[type]", ("type",)),
    ("same[type:model]", ("model", "type")),
    ("same[model,type]", ("model", "type")),
])
def test_same(text: str, expected: tuple) -> None:
    assert rr.parse(text) == ResReq(same=expected)


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_empty_text_is_empty_resreq(text: str) -> None:
    assert rr.parse(text) == ResReq()
    assert rr.format(ResReq()) == ""


def test_all_sections_any_order_any_spacing() -> None:
    expected = ResReq(select=And((gt("mem", 4, "G"), A)), order=(OrderKey("mem", True),),
                      rusage=(RusageTerm("mem", 4, "G", "host"),), span=Span(ptile=2), same=("type",))
    assert rr.parse("same[type] span[ptile=2]rusage[mem=4G/host] order[-mem] select[mem>4G && a]") == expected
    text = "SELECT [mem>4G && a] order[-mem] rusage[mem=4G/host] span[ptile=2] same[type]"
    assert rr.parse(text) == expected


@pytest.mark.parametrize("text, canonical", [
    ("same[type, model] select[mem>4G and (a or b)] rusage[mem=4096/host, lic=1]",
     'select[mem>4G && (a || b)] rusage[lic=1, mem=4096/host] same[model:type]'),
    ("select[ a || b && !c ]", "select[a || b && !c]"),
    ("select[!(a && b) && !defined(x) && !(mem>4)]", "select[!(a && b) && !defined(x) && !(mem>4)]"),
    ("select[type==X86_64]", 'select[type=="X86_64"]'),
    ("select[mem>=4gb && x<.5]", "select[mem>=4G && x<0.5]"),
    ("order[+a, -b]", "order[a:-b]"),
    ("rusage[x=1/task, y=0]", "rusage[x=1, y=0]"),
    ("span[maxhosts=2,ptile=4]", "span[ptile=4:maxhosts=2]"),
    ("span[hosts=1]", "span[hosts=1]"),
])
def test_canonical_format(text: str, canonical: str) -> None:
    assert rr.format(rr.parse(text)) == canonical


@pytest.mark.parametrize("value, text", [
    (1e-05, "0.00001"), (1e16, "10000000000000000.0"), (2.5, "2.5"), (-0.0, "-0.0"), (3, "3"),
])
def test_floats_format_without_exponent(value: float, text: str) -> None:
    assert rr.format(ResReq(select=gt("x", value))) == f"select[x>{text}]"
    assert rr.parse(f"select[x>{text}]").select == gt("x", value)


# ---------------------------------------------------------------- errors


ERRORS = [
    # (text, column, a fragment of what the message says)
    ("select[mem>>4]", 12, "expected a number or a name after '>', found '>'"),
    ("select[mem=>4]", 12, "expected a number, a string or a name after '=', found '>'"),
    ("select[mem<>4]", 12, "after '<', found '>'"),
    ("select[mem>4", 13, "expected '&&', '||' or ']' to close select[ (opened at column 7), found end of "),
    ("select[(a]", 10, "expected '&&', '||' or ')' to close the '(' at column 8, found ']'"),
    ("order[mem", 10, "to close order[ (opened at column 6), found end of input"),
    ("rusage[mem=4", 13, "to close rusage[ (opened at column 7)"),
    ("span[ptile=2", 13, "to close span["),
    ("same[a", 7, "to close same["),
    ("select", 7, "expected '[' after 'select', found end of input"),
    ("select(a)", 7, "expected '[' after 'select', found '('"),
    ("foo[a]", 1, "or same[...], found unknown section 'foo'"),
    ("mem>4", 1, "put the condition in select[...]"),
    ("cu[type:x]", 1, "the cu[...] section is not supported"),
    ("affinity[core(1)]", 1, "the affinity[...] section is not supported"),
    ("2*{select[a]}", 1, "compound requirements"),
    ("select[]", 8, "expected a condition (a name, a comparison, defined(...), '!' or '('), found ']'"),
    ("select[a &&]", 12, "expected a condition"),
    ("select[and]", 8, "expected a condition"),
    ("select[a & b]", 10, "found '&': write '&&'"),
    ("select[a | b]", 10, "found '|': write '||'"),
    ("select[a b]", 10, "expected '&&', '||' or ']'"),
    ("select[a, b]", 9, "found ','"),
    ("select[a] junk", 11, "unknown section 'junk'"),
    ("select[a]]", 10, "expected a section"),
    ("select[a] || select[b]", 11, "alternatives joined by '||' are not supported"),
    ("select[a] select[b]", 11, "expected each section once, found select[...] again (first at column 1)"),
    ("order[a] order[b]", 10, "found order[...] again"),
    ("select[!mem>4]", 12, "write !(mem>...)"),
    ("select[mem>maxmem]", 12, "comparing two resources is not supported"),
    ('select[mem<"a"]', 11, "expected '==' or '!=' before a string, found '<'"),
    ("select[4>5]", 8, "expected a resource name on one side of the comparison"),
    ("select[4]", 9, "expected a comparison operator after 4"),
    ("select[!4]", 9, "expected a name, defined(...), '!' or '('"),
    ('select[model=="EPYC]', 15, 'expected a closing " for the string'),
    ("select[mem>4x]", 13, "expected a unit (K, M, G or T)"),
    ("select[mem>4.5.6]", 15, "expected a unit"),
    ("select[defined mem]", 16, "expected '(' after 'defined', found 'mem'"),
    ("select[defined(a b)]", 18, "expected ')' to close 'defined('"),
    ("select[defined(and)]", 16, "reserved word"),
    ("order[]", 7, "expected a resource name to sort by, found ']'"),
    ("order[not]", 7, "reserved word"),
    ("order[- mem]", 8, "after '-'"),
    ("order[mem -mem]", 11, "expected each name once in order[...], found 'mem' again (first at column 7)"),
    ("rusage[]", 8, "expected a resource name, found ']'"),
    ("rusage[mem]", 11, "expected '=' after 'mem'"),
    ("rusage[mem=]", 12, "expected an amount after 'mem='"),
    ("rusage[mem=-4]", 12, "expected an amount >= 0 after 'mem=', found '-4'"),
    ("rusage[mem=-4G]", 12, "found '-4G'"),
    ("rusage[mem=4:duration=10]", 14, "rusage duration=... is not supported"),
    ("rusage[mem=4:decay=1]", 14, "rusage decay=... is not supported"),
    ("rusage[mem=4||lic=1]", 13, "'||' alternatives are not supported"),
    ("rusage[mem=4, mem=5]", 15, "found 'mem' again"),
    ("rusage[mem=4/node]", 14, "expected 'task', 'host' or 'job' after '/', found 'node'"),
    ("rusage[mem=4 lic=1]", 14, "expected ',', ':' or ']'"),
    ("span[]", 6, "expected a span key"),
    ("span[foo=1]", 6, "expected ptile=N, hosts=1, block=N or maxhosts=N, found unknown span key 'foo'"),
    ("span[hosts=2]", 12, "expected hosts=1 (every task on one host), found hosts=2"),
    ("span[hosts=0]", 12, "found hosts=0"),
    ("span[ptile=0]", 12, "expected a whole number >= 1 after 'ptile=', found 0"),
    ("span[block=0]", 12, ">= 1"),
    ("span[maxhosts=-1]", 15, ">= 1"),
    ("span[ptile=4.5]", 12, "expected a whole number after 'ptile=', found '4.5'"),
    ("span[ptile=x]", 12, "found 'x'"),
    ("span[hosts=1:ptile=2]", 14, "expected hosts or ptile in span[...], not both"),
    ("span[ptile=2,hosts=1]", 14, "not both"),
    ("span[hosts=1:maxhosts=2]", 14, "not both"),
    ("span[hosts=1:block=2]", 14, "not both"),
    ("span[ptile=2:block=2]", 14, "expected block or ptile in span[...], not both"),
    ("span[ptile=2:ptile=3]", 14, "found 'ptile' again"),
    ("same[]", 6, "expected an attribute name"),
    ("same[a::b]", 8, "expected an attribute name, found ':'"),
    ("same[a:a]", 8, "found 'a' again"),
]


@pytest.mark.parametrize("text, column, fragment", ERRORS)
def test_errors(text: str, column: int, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        rr.parse(text)
    error = caught.value
    assert isinstance(error, ResReqError)
    assert str(error).startswith(f'-R "{text}": at column {column}: expected'), str(error)
    assert fragment in str(error)
    assert error.position == column


def test_error_survives_pickling() -> None:
    with pytest.raises(ResReqError) as caught:
        rr.parse("select[]")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (type(copy), str(copy), copy.position) == (ResReqError, str(caught.value), 8)


def test_parse_wants_a_str() -> None:
    with pytest.raises(TypeError):
        rr.parse(None)  # type: ignore[arg-type]
