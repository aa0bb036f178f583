"""Job dependencies (`-w`): LSF's conditions, parsed, resolved to jobs and evaluated. Pure.

Standard library and errors only: the controller, the CLI (to check a flow before sending it) and
the simulator share it. Three steps, each a function:

1. `parse(text) -> Expr`: the grammar below; SpecError with the position (and a caret) on bad input.
2. `resolve(expr, lookup) -> Expr`: every `Ref` (a job as written: id, name, `name[7]`, a wildcard)
   becomes the `Target`s the caller's `lookup` finds for it; a ref that matches several jobs (a
   wildcard) becomes their AND: each of them must meet the condition.
3. `deps_eval.evaluate(expr, facts) -> Verdict`: true now or not, and whether that can still change
   (the facts: `deps_eval.group_facts`, what a target's jobs are now).

    expr  := and ('||' and)*
    and   := unary ('&&' unary)*
    unary := '!' unary | '(' expr ')' | cond
    cond  := done(ref) | ended(ref) | started(ref) | exit(ref [, [op] code])
           | numdone(ref, op N|*) | numended(ref, op N|*) | numexit(ref, op N|*)
           | ref                                   (a bare job means done(job), as in LSF)
    ref   := ID | ID[INDEX] | NAME | NAME[INDEX] | "any name"[INDEX]    (NAME may hold * wildcards)
    op    := == | != | > | >= | < | <=

Slurm's form is sugar for the same conditions: `afterok:ID[:ID...]` is done, `afterany` ended,
`afternotok` exit, `after` started; terms joined by `,` must all hold, by `?` any one; `ID_7` is
element 7 of array ID.

A target is a group of jobs: one job, or every element of an array. The conditions on a group:
done/ended/exit/started hold when they hold for EVERY element; the num* forms compare a count of
elements with N (`*` is the array's size). Finished states are final (a retried job goes back to
PEND, never through EXIT), so counts only grow, and a verdict can be `final`: `done(5)` once job 5
ended EXIT can never become true, and the caller cancels the dependant (or keeps it pending with
that reason). `started` means the job ran: an element that ended without starting (killed while it
pended) makes `started` false for good.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from xce_lite.errors import SpecError

PLAIN = ("done", "ended", "exit", "started")
COUNTS = ("numdone", "numended", "numexit")
OPS = ("==", "!=", ">=", "<=", ">", "<")
SLURM = {"after": "started", "afterok": "done", "afternotok": "exit", "afterany": "ended"}
MAX_TEXT = 65536  # a flow step after a thousand others says done(...) a thousand times
_TOKEN = re.compile(r"""\s*(?:(?P<op>&&|\|\||==|!=|>=|<=|[()\[\],!<>])"""
                    r"""|"(?P<str>(?:[^"\\]|\\.)*)"|(?P<word>[^\s()\[\],!<>=&|"]+))""")
_SLURM_TERM = re.compile(r"(after|afterok|afternotok|afterany)((?::\d+(?:_\d+)?)+)")


# ---- the expression --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A job as the user wrote it: an id or a name (maybe with * wildcards), maybe one element."""

    id: int | None = None
    name: str | None = None
    index: int | None = None
    pos: int = field(default=0, compare=False)  # where it starts in the text, for errors

    def text(self) -> str:
        base = str(self.id) if self.id is not None else _name_text(self.name or "")
        return base if self.index is None else f"{base}[{self.index}]"


@dataclass(frozen=True)
class Target:
    """A resolved group of jobs: job `id` alone, or every element of array `id` (`array`).
    `label` is how the user named it (kept for messages)."""

    id: int
    array: bool = False
    label: str = ""

    def text(self) -> str:
        return str(self.id)


@dataclass(frozen=True)
class Cond:
    kind: str  # one of PLAIN or COUNTS
    ref: Ref | Target
    op: str | None = None  # exit: None (any code) or an op; counts: always an op
    value: int | None = None  # counts: None is `*` (the group's size)


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class And:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    items: tuple[Expr, ...]


Expr = Cond | Not | And | Or


def format_expr(expr: Expr, ref_text: Callable[[Ref | Target], str] | None = None) -> str:
    """Canonical text: `parse(format_expr(e)) == e` for a parsed expression. `ref_text`: how to
    write each job (default: as parsed, or by id once resolved)."""
    show = ref_text or (lambda ref: ref.text())
    if isinstance(expr, Cond):
        args = show(expr.ref)
        if expr.kind in COUNTS:
            args += f", {expr.op} {'*' if expr.value is None else expr.value}"
        elif expr.op is not None:
            args += f", {expr.op} {expr.value}"
        return f"{expr.kind}({args})"
    if isinstance(expr, Not):
        inner = format_expr(expr.operand, ref_text)
        return "!" + (inner if isinstance(expr.operand, (Cond, Not)) else f"({inner})")
    joiner = " && " if isinstance(expr, And) else " || "
    return joiner.join(f"({format_expr(i, ref_text)})" if isinstance(i, (And, Or)) else format_expr(i, ref_text)
                       for i in expr.items)


def labelled(expr: Expr) -> str:
    """The expression with each job as the user named it (`done(prep)` rather than `done(41)`)."""
    return format_expr(expr, lambda ref: ref.label if isinstance(ref, Target) and ref.label else ref.text())


def _name_text(name: str) -> str:
    if name and not name.isdigit() and re.fullmatch(r"[^\s()\[\],!<>=&|\"\\]+", name):
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---- parsing ---------------------------------------------------------------------------------------


def parse(text: str) -> Expr:
    """The expression `text` says; SpecError with the position of what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError("-w: the dependency is empty; write a condition such as done(42)")
    if len(text) > MAX_TEXT:
        raise SpecError(f"-w: the dependency is longer than {MAX_TEXT} characters")
    if re.match(r"\s*after\w*:", text):
        return _parse_slurm(text)
    parser = _Parser(text)
    expr = parser.expr()
    if parser.peek() is not None:
        parser.fail("expected && or || or the end here")
    return expr


def _error(text: str, pos: int, message: str) -> SpecError:
    return SpecError(f"-w at position {pos + 1}: {message}\n  {text}\n  {' ' * pos}^")


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, value, position)
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                if text[pos:].strip() == "":
                    break
                start = len(text) - len(text[pos:].lstrip())
                raise _error(text, start, f"unexpected {text[start]!r}")
            kind = match.lastgroup or ""
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            pos = match.end()
        self.at = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def fail(self, message: str) -> NoReturn:
        token = self.peek()
        raise _error(self.text, token[2] if token else len(self.text), message)

    def take(self, value: str) -> bool:
        token = self.peek()
        if token is not None and token[0] == "op" and token[1] == value:
            self.at += 1
            return True
        return False

    def expect(self, value: str, what: str) -> None:
        if not self.take(value):
            self.fail(f"expected {value!r} {what}")

    def expr(self) -> Expr:
        items = [self.conjunction()]
        while self.take("||"):
            items.append(self.conjunction())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def conjunction(self) -> Expr:
        items = [self.unary()]
        while self.take("&&"):
            items.append(self.unary())
        return items[0] if len(items) == 1 else And(tuple(items))

    def unary(self) -> Expr:
        if self.take("!"):
            return Not(self.unary())
        if self.take("("):
            inner = self.expr()
            self.expect(")", "to close the parenthesis")
            return inner
        token = self.peek()
        if token is None:
            self.fail("expected a condition such as done(42)")
        kind, value, _pos = token
        if kind == "word" and value in PLAIN + COUNTS and self._next_is("("):
            self.at += 2
            return self.condition(value)
        if kind == "word" and self._next_is("("):  # `finished(3)`: a typo of a condition, not a job name
            self.fail(f"unknown condition {value!r}; the conditions are {', '.join(PLAIN + COUNTS)}")
        if kind in ("word", "str"):
            return Cond("done", self.ref())
        self.fail("expected a condition such as done(42)")
        raise AssertionError("unreachable")

    def _next_is(self, value: str) -> bool:
        nxt = self.tokens[self.at + 1] if self.at + 1 < len(self.tokens) else None
        return nxt is not None and nxt[0] == "op" and nxt[1] == value

    def condition(self, kind: str) -> Cond:
        ref = self.ref()
        op, value = None, None
        if kind in COUNTS:
            self.expect(",", f"and a comparison: {kind}(ID, >= N)")
            op = self.op()
            token = self.peek()
            if token is not None and token[0] == "word" and token[1] == "*":
                self.at += 1
            else:
                value = self.number("a count, or * for the whole array", allow_zero=True)
        elif kind == "exit" and self.take(","):
            op = self.op(default="==")
            value = self.number("an exit code", allow_zero=True)
        self.expect(")", f"to close {kind}(")
        return Cond(kind, ref, op, value)

    def op(self, default: str | None = None) -> str:
        token = self.peek()
        if token is not None and token[0] == "op" and token[1] in OPS:
            self.at += 1
            return token[1]
        if default is not None:
            return default
        self.fail("expected a comparison: == != > >= < <=")
        raise AssertionError("unreachable")

    def number(self, what: str, allow_zero: bool = False) -> int:
        token = self.peek()
        if token is None or token[0] != "word" or not token[1].isdigit() or (int(token[1]) == 0 and not allow_zero):
            self.fail(f"expected {what}")
        self.at += 1
        return int(token[1])

    def ref(self) -> Ref:
        token = self.peek()
        if token is None or token[0] not in ("word", "str"):
            self.fail("expected a job: its id, or its name")
        kind, value, pos = token
        self.at += 1
        if kind == "str":
            name = re.sub(r"\\(.)", r"\1", value)
            if not name:
                raise _error(self.text, pos, "a job name cannot be empty")
            ref = Ref(name=name, pos=pos)
        elif value.isdigit():
            if int(value) == 0:
                raise _error(self.text, pos, "job ids start at 1")
            ref = Ref(id=int(value), pos=pos)
        else:
            ref = Ref(name=value, pos=pos)
        if self.take("["):
            index = self.number("an array index (a whole number from 1)")
            self.expect("]", "after the array index")
            ref = Ref(ref.id, ref.name, index, pos)
        return ref


def _parse_slurm(text: str) -> Expr:
    """`afterok:1:2,afterany:3` (all) or `afterok:1?afterany:3` (any)."""
    stripped = text.strip()
    joiner = "?" if "?" in stripped else ","
    if joiner == "?" and "," in stripped:
        raise _error(text, text.index(","), "Slurm dependencies join terms with ',' (all) or '?' (any), not both")
    terms: list[Expr] = []
    offset = text.index(stripped)
    for part in stripped.split(joiner):
        match = _SLURM_TERM.fullmatch(part.strip())
        if match is None:
            raise _error(text, offset, f"{part.strip()!r} is not a Slurm dependency such as afterok:42 or "
                                       f"afterany:42:43 (types: {', '.join(SLURM)})")
        kind = SLURM[match[1]]
        for job in match[2].strip(":").split(":"):
            number, _, index = job.partition("_")
            terms.append(Cond(kind, Ref(id=int(number), index=int(index) if index else None, pos=offset)))
        offset += len(part) + 1
    if len(terms) == 1:
        return terms[0]
    return And(tuple(terms)) if joiner == "," else Or(tuple(terms))


# ---- resolution ------------------------------------------------------------------------------------


Lookup = Callable[[Ref], Sequence[Target]]


def refs(expr: Expr) -> list[Ref | Target]:
    """The jobs `expr` names, in order of appearance."""
    if isinstance(expr, Cond):
        return [expr.ref]
    if isinstance(expr, Not):
        return refs(expr.operand)
    return [ref for item in expr.items for ref in refs(item)]


def resolve(expr: Expr, lookup: Lookup) -> Expr:
    """Every Ref replaced by its targets (`lookup` raises SpecError for one that names nothing);
    a Ref with several targets becomes the AND of the condition on each."""
    if isinstance(expr, Cond):
        if isinstance(expr.ref, Target):
            return expr
        found = lookup(expr.ref)
        if not found:
            raise SpecError(f"-w: {expr.ref.text()} names no job")
        plain = [t for t in found if not t.array]
        if expr.kind in COUNTS and plain:  # counting the elements of one job is a mistake, not a condition
            what = f"job {plain[0].id}" if plain[0].label in ("", str(plain[0].id)) else \
                f"{plain[0].label} (job {plain[0].id})"
            raise SpecError(f"-w: {expr.kind}({expr.ref.text()}, ...) counts the elements of an array, and {what} is "
                            f"not an array; use done({expr.ref.text()}) or ended({expr.ref.text()})")
        conds = tuple(Cond(expr.kind, target, expr.op, expr.value) for target in found)
        return conds[0] if len(conds) == 1 else And(conds)
    if isinstance(expr, Not):
        return Not(resolve(expr.operand, lookup))
    return type(expr)(tuple(resolve(item, lookup) for item in expr.items))


def targets(expr: Expr) -> set[Target]:
    return {ref for ref in refs(expr) if isinstance(ref, Target)}


# ---- storing a resolved expression -----------------------------------------------------------------


def to_json(expr: Expr) -> dict:
    """A resolved expression as plain JSON values (the store keeps it with the job)."""
    if isinstance(expr, Cond):
        ref = expr.ref
        if not isinstance(ref, Target):
            raise ValueError("only a resolved expression is stored")
        data = {"c": expr.kind, "id": ref.id, "label": ref.label}
        if ref.array:
            data["array"] = True
        if expr.op is not None:
            data.update(op=expr.op, n=expr.value)
        return data
    if isinstance(expr, Not):
        return {"not": to_json(expr.operand)}
    return {"and" if isinstance(expr, And) else "or": [to_json(i) for i in expr.items]}


def from_json(data: Mapping) -> Expr:
    if "c" in data:
        return Cond(data["c"], Target(data["id"], bool(data.get("array")), data.get("label", "")),
                    data.get("op"), data.get("n"))
    if "not" in data:
        return Not(from_json(data["not"]))
    if "and" in data:
        return And(tuple(from_json(i) for i in data["and"]))
    return Or(tuple(from_json(i) for i in data["or"]))
