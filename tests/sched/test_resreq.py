"""Tests of the `-R` resource requirement language: tables per section, errors, evaluation, and
hypothesis round trips over ResReq values built directly (not only over strings)."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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

A, B, C, D = Name("a"), Name("b"), Name("c"), Name("d")


def gt(name: str, value: float, unit: str | None = None) -> Compare:
    return Compare(">", Name(name), Number(value, unit))


def eq(name: str, value: str) -> Compare:
    return Compare("==", Name(name), String(value))


def select(text: str) -> object:
    return rr.parse(f"select[{text}]").select


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


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("build", [
    lambda: Name("and"), lambda: Name("1x"), lambda: Name("a-b"), lambda: Defined(""),
    lambda: Number(float("nan")), lambda: Number(float("inf")), lambda: Number(True), lambda: Number(1, "k"),
    lambda: Number("1"), lambda: Compare("<", Name("a"), String("x")), lambda: Compare("=", A, Number(1)),
    lambda: Compare("==", Number(1), Number(1)), lambda: And((A,)), lambda: Or(()), lambda: Not(Number(1)),
    lambda: RusageTerm("mem", -1), lambda: RusageTerm("duration", 1),
    lambda: RusageTerm("mem", 1, per="node"),
    lambda: Span(), lambda: Span(one_host=True, ptile=2), lambda: Span(ptile=0), lambda: Span(ptile=True),
    lambda: Span(block=2, ptile=2), lambda: ResReq(order=(OrderKey("a"), OrderKey("a", True))),
    lambda: ResReq(same=("a", "a")), lambda: ResReq(rusage=(RusageTerm("a", 1), RusageTerm("a", 2))),
    lambda: ResReq(select=Number(1)),  # type: ignore[arg-type]
])
def test_invalid_values_cannot_be_built(build) -> None:
    with pytest.raises(ValueError):
        build()


def test_values_are_normalised_on_construction() -> None:
    assert And((And((A, B)), C)) == And((A, B, C))
    assert Or((A, Or((B, C)))) == Or((A, B, C))
    assert And((Or((A, B)), C)).items == (Or((A, B)), C)
    one = ResReq(rusage=[RusageTerm("b", 1), RusageTerm("a", 2)], same=["y", "x"])  # type: ignore[arg-type]
    two = ResReq(rusage=(RusageTerm("a", 2), RusageTerm("b", 1)), same=("x", "y"))
    assert one == two and hash(one) == hash(two)
    assert rr.parse("rusage[b=1, a=2] same[y:x]") == two
    assert rr.format(ResReq(rusage=(RusageTerm("mem", -0.0),))) == "rusage[mem=0.0]"


def test_large_numbers_round_trip() -> None:
    for r in (ResReq(select=gt("x", 10**400)), ResReq(rusage=(RusageTerm("x", 1.7e308, "T"),))):
        assert rr.parse(rr.format(r)) == r


# ---------------------------------------------------------------- names, units, evaluate


def test_names() -> None:
    r = rr.parse("select[mem>4 && type==X86_64 && defined(gpu) && !avx || 4<ncpus] order[-slots] "
                 "rusage[lic=1] span[ptile=2] same[model]")
    assert rr.names(r) == {"mem", "type", "gpu", "avx", "ncpus", "slots", "lic", "model"}
    assert rr.names(ResReq()) == set()


@pytest.mark.parametrize("x, default, expected", [
    (Number(4, "G"), "M", 4 * 2**30),
    (Number(4096), "M", 4 * 2**30),
    (Number(4096, "B"), "M", 4096),
    (Number(4, "K"), None, 4096),
    (Number(2, "T"), None, 2 * 2**40),
    (Number(4), None, 4),
    (Number(0.5, "K"), None, 512),
    (Number(1.0), None, 1),
    (Number(0.3), None, 0.3),
    (Number(-5), None, -5),
    (RusageTerm("mem", 1.5, "G", "host"), "M", 1536 * 2**20),
    (RusageTerm("lic", 2, None, "job"), None, 2),
])
def test_amount_in_base_units(x, default, expected) -> None:
    got = rr.amount_in_base_units(x, default)
    assert got == expected and type(got) is type(expected)


def test_amount_rejects_unknown_default_unit() -> None:
    with pytest.raises(ValueError):
        rr.amount_in_base_units(Number(1), "X")


def test_default_units_follow_lsf() -> None:
    assert [rr.default_unit(n) for n in ("mem", "swp", "tmp", "maxmem", "ncpus", "lic")] == \
        ["M", "M", "M", "M", None, None]


HOST = {"mem": 8 * 2**30, "ncpus": 16, "type": "X86_64", "model": "EPYC 7", "avx512": True, "r15s": 0.3,
        "idle": 0, "off": False, "label": ""}


@pytest.mark.parametrize("text, expected", [
    ("mem>4G", True), ("mem>4096", True), ("mem>8192", False), ("mem>=8192", True), ("mem>=8G", True),
    ("mem<10000", True), ("mem==8G", True), ("mem>4194304K", True), ("mem>8589934592B", False),
    ("ncpus>=16", True), ("ncpus>16", False), ("ncpus>15.5", True), ("16<=ncpus", True),
    ("r15s<0.5", True), ("r15s>0.5", False),
    ("type==X86_64", True), ("type!=X86_64", False), ('type=="x86_64"', False), ('model=="EPYC 7"', True),
    ("avx512", True), ("avx2", False), ("!avx2", True), ("idle", False), ("off", False), ("label", False),
    ("ncpus", True), ("type", True), ("avx512==1", True),
    ("defined(avx512)", True), ("defined(idle)", True), ("defined(avx2)", False), ("!defined(gpus)", True),
    # A missing name makes every comparison false, even !=; so does a string against a number.
    ("gpus>0", False), ("gpus<1", False), ("gpus!=1", False), ("gpus!=x", False),
    ("type>4", False), ("mem==X", False), ("mem!=X", False),
    ("avx2 && mem>4G || ncpus>8", True), ("avx2 && (mem>4G || ncpus>8)", False),
    ("!(mem>4G) || !avx512", False), ("not avx2 and type==X86_64", True),
])
def test_evaluate(text: str, expected: bool) -> None:
    assert rr.evaluate(select(text), HOST, rr.default_unit) is expected


def test_evaluate_no_select_matches_every_host() -> None:
    assert rr.evaluate(None, {}, rr.default_unit) is True


def test_evaluate_uses_unit_for() -> None:
    expr = select("scratch>100")
    assert rr.evaluate(expr, {"scratch": 2 * 2**30}, lambda name: "M")
    assert not rr.evaluate(expr, {"scratch": 2 * 2**30}, lambda name: "G")


# ---------------------------------------------------------------- combine (repeated -R)


def combined(*texts: str) -> str:
    return rr.format(rr.combine([rr.parse(t) for t in texts]))


@pytest.mark.parametrize("texts, expected", [
    ((), ""),
    (("select[a]",), "select[a]"),
    (("select[a]", "select[b]"), "select[a && b]"),
    (("select[a || b]", "select[c && d]"), "select[(a || b) && c && d]"),
    (("select[a] rusage[mem=4G]", "rusage[lic=1/job] select[b]"), "select[a && b] rusage[lic=1/job, mem=4G]"),
    (("rusage[mem=4G]", "rusage[mem=4G]"), "rusage[mem=4G]"),
    (("order[-mem:a]", "order[b:-mem]"), "order[-mem:a:b]"),
    (("span[ptile=2]", "span[ptile=2] same[x]", "same[y:x]"), "span[ptile=2] same[x:y]"),
])
def test_combine(texts: tuple, expected: str) -> None:
    assert combined(*texts) == expected


@pytest.mark.parametrize("texts, fragments", [
    (("rusage[mem=4G]", "rusage[mem=8G]"), ["-R #1 has rusage[mem=4G]", "-R #2 has rusage[mem=8G]"]),
    (("rusage[mem=4096]", "select[a]", "rusage[mem=4G]"), ["-R #1 has rusage[mem=4096]", "-R #3"]),
    (("rusage[mem=4G]", "rusage[mem=4G/host]"), ["mem=4G/host"]),
    (("order[mem]", "order[-mem]"), ["-R #1 has order[mem]", "-R #2 has order[-mem]"]),
    (("span[ptile=2]", "span[ptile=4]"), ["-R #1 has span[ptile=2]", "-R #2 has span[ptile=4]"]),
])
def test_combine_conflicts(texts: tuple, fragments: list) -> None:
    with pytest.raises(ResReqError) as caught:
        rr.combine([rr.parse(t) for t in texts])
    assert all(f in str(caught.value) for f in fragments), str(caught.value)
    assert caught.value.position is None


# ---------------------------------------------------------------- purity


RESREQ_MODULES = ("resreq", "resreq_values", "resreq_cursor", "resreq_select", "resreq_parse")


@pytest.mark.parametrize("module", [f"{m}.py" for m in RESREQ_MODULES])
def test_modules_import_only_the_standard_library_and_errors(module: str) -> None:
    tree = ast.parse((Path(rr.__file__).parent / module).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    # the language's own modules, each other (`from xce_lite.sched import resreq_values` names the package)
    allowed = {"xce_lite.errors", "xce_lite.sched", *(f"xce_lite.sched.{m}" for m in RESREQ_MODULES)}
    assert {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names} <= allowed


@pytest.mark.parametrize("first", ["xce_lite.sched.resreq", "xce_lite.sched.resreq_parse"])
def test_either_module_can_be_imported_first(first: str) -> None:
    code = f"import {first}\nfrom xce_lite.sched import resreq\nprint(resreq.parse('span[ptile=2]'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == repr(ResReq(span=Span(ptile=2))), done.stderr


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
