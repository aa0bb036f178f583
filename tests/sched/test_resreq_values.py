"""Tests of the `-R` language's values: construction, names and units, evaluation against a host,
combining repeated -R, and the purity of its modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.resreq import A, B, C, gt, select
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
