"""The parser of the `-R` resource requirement language (syntax: the docstring of `resreq.py`).

One pass over the text with a cursor: the select section is lexed into tokens on demand, the other
sections are read character by character. Every error is a ResReqError whose message reads
`-R "<text>": at column N: expected ..., found ...` (N is 1-based and counts characters) and whose
`position` is N. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from xce_lite.sched import resreq as rr

SECTIONS = ("select", "order", "rusage", "span", "same")
_SECTION_LIST = "select[...], order[...], rusage[...], span[...] or same[...]"
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:([KMGTkmgt])[Bb]?|([Bb]))?")
_WHOLE = re.compile(r"-?[0-9]+")
_WORD_CHAR = re.compile(r"[A-Za-z0-9_.]")
_UNTIL_SEPARATOR = re.compile(r"[^\s,:\]/]*")
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ONE_CHAR_TOKENS = {"<": "cmp", ">": "cmp", "=": "cmp", "!": "not", "(": "lp", ")": "rp", "]": "end"}
_SPAN_KEYS = ("ptile", "hosts", "block", "maxhosts")
_SPAN_CONFLICTS = {  # pairs of span keys that contradict each other, with why
    ("hosts", "ptile"): "hosts=1 already puts every task on one host",
    ("hosts", "block"): "hosts=1 already puts every task on one host",
    ("hosts", "maxhosts"): "hosts=1 already means one host",
    ("block", "ptile"): "both say how many tasks go on a host",
}


def parse(text: str) -> rr.ResReq:
    """Parse one `-R` string; "" (or only whitespace) gives ResReq()."""
    if not isinstance(text, str):
        raise TypeError(f"parse() takes a str, not {type(text).__name__}")
    return _Parser(text).parse()


@dataclass(frozen=True)
class _Token:
    kind: str  # cmp and or not lp rp end(']') eof word num str defined other
    text: str  # as written
    pos: int  # 0-based start
    end: int
    value: object = None  # cmp: the operator, `=` as `==`; num: an rr.Number; str: the decoded text


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # -------------------------------------------------------------- plumbing

    def error(self, pos: int, message: str) -> NoReturn:
        raise rr.ResReqError(f'-R "{self.text}": at column {pos + 1}: {message}', pos + 1)

    def skip_ws(self) -> bool:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        return self.pos > start

    def char(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def found(self, pos: int) -> str:
        """What is at `pos`, for the "found ..." of a message."""
        if pos >= len(self.text):
            return "end of input"
        match = _WORD.match(self.text, pos) or _NUMBER.match(self.text, pos)
        return f"'{match.group() if match else self.text[pos]}'"

    def expect(self, pos: int, what: str) -> NoReturn:
        self.error(pos, f"expected {what}, found {self.found(pos)}")

    def name(self, what: str) -> tuple[str, int]:
        start = self.pos
        match = _WORD.match(self.text, start)
        if not match:
            self.expect(start, what)
        if match.group().lower() in rr.RESERVED_WORDS:
            self.error(start, f"expected {what}, found '{match.group()}', which is a reserved word")
        self.pos = match.end()
        return match.group(), start

    def number(self, what: str) -> rr.Number:
        """An unsigned number with an optional unit; callers deal with a sign."""
        start = self.pos
        match = _NUMBER.match(self.text, start)
        if not match:
            self.expect(start, what)
        self.pos = match.end()
        if _WORD_CHAR.match(self.char()):
            self.expect(self.pos, "a unit (K, M, G or T) or the end of the number")
        digits, unit = match.group(1), match.group(2) or match.group(3)
        try:
            value: int | float = float(digits) if "." in digits else int(digits)
        except ValueError:  # more digits than int() takes
            self.error(start, f"expected a number of at most 4300 digits, found {digits[:20]}...")
        return rr.Number(value, unit.upper() if unit else None)

    def whole_number(self, what: str) -> tuple[int, int]:
        start = self.pos
        match = _WHOLE.match(self.text, start)
        if not match or _WORD_CHAR.match(self.text[match.end():match.end() + 1] or " "):
            bad = _UNTIL_SEPARATOR.match(self.text, start).group()  # type: ignore[union-attr]
            self.error(start, f"expected {what}, found " + (f"'{bad}'" if bad else self.found(start)))
        self.pos = match.end()
        return int(match.group()), start

    def expect_char(self, char: str, what: str) -> None:
        self.skip_ws()
        if self.char() != char:
            self.expect(self.pos, what)
        self.pos += 1

    # -------------------------------------------------------------- sections

    def parse(self) -> rr.ResReq:
        sections: dict[str, tuple[object, int]] = {}
        while True:
            self.skip_ws()
            if self.pos >= len(self.text):
                break
            start = self.pos
            match = _WORD.match(self.text, start)
            if not match:
                hint = ""
                if self.text.startswith("||", start):
                    hint = " (alternatives joined by '||' are not supported)"
                elif self.text[start] in "0123456789{":
                    hint = " (compound requirements n*{...} are not supported)"
                self.error(start, f"expected a section ({_SECTION_LIST}), found {self.found(start)}{hint}")
            word, key = match.group(), match.group().lower()
            self.pos = match.end()
            self.skip_ws()
            if key in ("cu", "affinity"):
                self.error(start, f"expected {_SECTION_LIST}, found '{word}': the {key}[...] section is "
                                  "not supported")
            if key not in SECTIONS:
                # `-R "mem>4"`: LSF lets the first section be a select without its keyword; we do not.
                bare = self.char() != "[" and not sections
                hint = "; to select hosts, put the condition in select[...]" if bare else ""
                self.error(start, f"expected {_SECTION_LIST}, found unknown section '{word}'{hint}")
            if key in sections:
                advice = "give it once"
                if key == "select":
                    advice = "join the conditions with && in one select[...]"
                self.error(start, f"expected each section once, found {key}[...] again (first at column "
                                  f"{sections[key][1] + 1}): {advice}")
            if self.char() != "[":
                self.expect(self.pos, f"'[' after '{word}'")
            opened = self.pos
            self.pos += 1
            sections[key] = (getattr(self, "section_" + key)(opened), start)
        return rr.ResReq(**{key: value for key, (value, _) in sections.items()})  # type: ignore[arg-type]

    def items(self, section: str, opened: int, item: Callable[[], tuple[object, str, int]],
              separators: str, spaces_separate: bool = False) -> list:
        """Items up to and including the closing ']', separated by one of `separators` (or by spaces).
        `item()` reads one and returns (value, name, start); a name given twice is an error."""
        values: list = []
        seen: dict[str, int] = {}  # name -> where it was given
        while True:
            self.skip_ws()
            value, name, start = item()
            if name in seen:
                self.error(start, f"expected each name once in {section}[...], found '{name}' again "
                                  f"(first at column {seen[name] + 1})")
            seen[name] = start
            values.append(value)
            spaced = self.skip_ws()
            if self.char() and self.char() in separators:
                self.pos += 1
            elif self.char() == "]":
                self.pos += 1
                return values
            elif not (spaces_separate and spaced and self.char()):
                hint = ""
                if self.text.startswith("||", self.pos):
                    hint = " ('||' alternatives are not supported)"
                expected = ", ".join(f"'{s}'" for s in separators) + " or ']'"
                self.error(self.pos, f"expected {expected} to close {section}[ (opened at column "
                                     f"{opened + 1}), found {self.found(self.pos)}{hint}")

    def section_order(self, opened: int) -> tuple[rr.OrderKey, ...]:
        def key() -> tuple[rr.OrderKey, str, int]:
            start, sign = self.pos, self.char()
            signed = sign in ("-", "+")
            self.pos += signed
            name, _ = self.name("a resource name to sort by" + (f" after '{sign}'" if signed else ""))
            return rr.OrderKey(name, sign == "-"), name, start

        return tuple(self.items("order", opened, key, ",:", spaces_separate=True))

    def section_rusage(self, opened: int) -> tuple[rr.RusageTerm, ...]:
        def term() -> tuple[rr.RusageTerm, str, int]:
            name, start = self.name("a resource name")
            if name.lower() in rr.UNSUPPORTED_RUSAGE_KEYS:
                self.error(start, f"expected a resource name, found '{name}': rusage {name}=... is not "
                                  "supported (resources are reserved for the whole life of the job)")
            self.expect_char("=", f"'=' after '{name}'")
            self.skip_ws()
            if self.char() == "-":
                bad = _UNTIL_SEPARATOR.match(self.text, self.pos).group()  # type: ignore[union-attr]
                self.error(self.pos, f"expected an amount >= 0 after '{name}=', found '{bad}': rusage "
                                     "amounts cannot be negative")
            number = self.number(f"an amount after '{name}='")
            per = "task"
            self.skip_ws()
            if self.char() == "/":
                self.pos += 1
                self.skip_ws()
                match = _WORD.match(self.text, self.pos)
                if not match or match.group() not in rr.PER_VALUES:
                    self.expect(self.pos, "'task', 'host' or 'job' after '/'")
                per, self.pos = match.group(), match.end()
            return rr.RusageTerm(name, number.value, number.unit, per), name, start

        return tuple(self.items("rusage", opened, term, ",:"))

    def section_span(self, opened: int) -> rr.Span:
        def key() -> tuple[tuple[str, int, int], str, int]:
            name, start = self.name("a span key (ptile, hosts, block or maxhosts)")
            if name not in _SPAN_KEYS:
                self.error(start, f"expected ptile=N, hosts=1, block=N or maxhosts=N, found unknown span "
                                  f"key '{name}'")
            self.expect_char("=", f"'=' after '{name}'")
            self.skip_ws()
            value, at = self.whole_number(f"a whole number after '{name}='")
            if name == "hosts" and value != 1:
                self.error(at, f"expected hosts=1 (every task on one host), found hosts={value}; to use at "
                               "most N hosts write span[maxhosts=N]")
            if value < 1:
                self.error(at, f"expected a whole number >= 1 after '{name}=', found {value}")
            return (name, value, start), name, start

        given = {name: (value, start) for name, value, start in self.items("span", opened, key, ",:")}
        for (a, b), why in _SPAN_CONFLICTS.items():
            if a in given and b in given:  # point at the later of the two
                later = max(given[a][1], given[b][1])
                self.error(later, f"expected {a} or {b} in span[...], not both: {why}")
        value = {name: number for name, (number, _) in given.items()}
        return rr.Span(ptile=value.get("ptile"), one_host="hosts" in value, block=value.get("block"),
                       max_hosts=value.get("maxhosts"))

    def section_same(self, opened: int) -> tuple[str, ...]:
        def attribute() -> tuple[str, str, int]:
            name, start = self.name("an attribute name")
            return name, name, start

        return tuple(self.items("same", opened, attribute, ",:"))

    # -------------------------------------------------------------- select: recursive descent

    def section_select(self, opened: int) -> rr.Expr:
        expr = self.disjunction()
        token = self.take()
        if token.kind != "end":
            self.error(token.pos, f"expected '&&', '||' or ']' to close select[ (opened at column "
                                  f"{opened + 1}), found {self.describe(token)}")
        return expr

    def disjunction(self) -> rr.Expr:
        items = [self.conjunction()]
        while self.peek().kind == "or":
            self.take()
            items.append(self.conjunction())
        return items[0] if len(items) == 1 else rr.Or(tuple(items))

    def conjunction(self) -> rr.Expr:
        items = [self.unary()]
        while self.peek().kind == "and":
            self.take()
            items.append(self.unary())
        return items[0] if len(items) == 1 else rr.And(tuple(items))

    def unary(self) -> rr.Expr:
        if self.peek().kind != "not":
            return self.primary(allow_compare=True)
        bang = self.take()
        if self.peek().kind == "not":
            return rr.Not(self.unary())
        operand = self.primary(allow_compare=False)
        after = self.peek()
        if after.kind == "cmp":  # `!mem>4` would compare a truth value with 4: surely not meant
            shown = operand.name if isinstance(operand, rr.Name) else "..."
            self.error(after.pos, f"expected a condition in parentheses after '{bang.text}', found "
                                  f"'{after.text}' after '{shown}': '{bang.text}' binds tighter than "
                                  f"comparisons, so write {bang.text}({shown}{after.text}...)")
        return rr.Not(operand)

    def primary(self, allow_compare: bool) -> rr.Expr:
        token = self.take()
        if token.kind == "lp":
            expr = self.disjunction()
            close = self.take()
            if close.kind != "rp":
                self.error(close.pos, f"expected '&&', '||' or ')' to close the '(' at column "
                                      f"{token.pos + 1}, found {self.describe(close)}")
            return expr
        if token.kind == "defined":
            return self.defined(token)
        if token.kind == "word" and not (allow_compare and self.peek().kind == "cmp"):
            return rr.Name(token.text)
        if token.kind in ("word", "num", "str") and allow_compare:
            op = self.take()
            if op.kind != "cmp":
                self.error(op.pos, f"expected a comparison operator after {token.text}, found "
                                   f"{self.describe(op)}")
            return self.comparison(token, op)
        expected = ("a condition (a name, a comparison, defined(...), '!' or '(')" if allow_compare
                    else "a name, defined(...), '!' or '('")
        self.error(token.pos, f"expected {expected}, found {self.describe(token)}")

    def defined(self, keyword: _Token) -> rr.Defined:
        token = self.take()
        if token.kind != "lp":
            self.error(token.pos, f"expected '(' after '{keyword.text}', found {self.describe(token)}")
        self.skip_ws()
        name, _ = self.name("a resource name in defined(...)")
        token = self.take()
        if token.kind != "rp":
            self.error(token.pos, f"expected ')' to close '{keyword.text}(', found {self.describe(token)}")
        return rr.Defined(name)

    def comparison(self, left: _Token, op: _Token) -> rr.Compare:
        """`name op literal`, or `literal op name` turned around; a bare word on the right is a string."""
        right = self.take()
        ordering = op.value not in ("==", "!=")
        if right.kind not in ("word", "num", "str"):
            what = "a number or a name" if ordering else "a number, a string or a name"
            self.error(right.pos, f"expected {what} after '{op.text}', found {self.describe(right)}")
        if left.kind == "word":
            name, literal, symbol = left, right, str(op.value)
        elif right.kind == "word":
            name, literal, symbol = right, left, _FLIP[str(op.value)]
        else:
            self.error(left.pos, f"expected a resource name on one side of the comparison, found "
                                 f"{left.text}{op.text}{right.text}")
        if literal.kind == "num":
            return rr.Compare(symbol, rr.Name(name.text), literal.value)  # type: ignore[arg-type]
        if ordering and literal.kind == "word":
            self.error(literal.pos, f"expected a number after '{op.text}', found '{literal.text}': comparing "
                                    "two resources is not supported, and strings compare only with == and !=")
        if ordering:
            self.error(op.pos, f"expected '==' or '!=' before a string, found '{op.text}': strings are not "
                               "ordered")
        value = literal.text if literal.kind == "word" else str(literal.value)
        return rr.Compare(symbol, rr.Name(name.text), rr.String(value))

    # -------------------------------------------------------------- select: tokens

    def describe(self, token: _Token) -> str:
        return "end of input" if token.kind == "eof" else f"'{token.text}'"

    def take(self) -> _Token:
        token = self.peek()
        self.pos = token.end
        return token

    def peek(self) -> _Token:
        """The token after the cursor (skipping whitespace), without moving the cursor."""
        text, i = self.text, self.pos
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return _Token("eof", "", i, i)
        two, c = text[i:i + 2], text[i]
        if two in ("==", "!=", "<=", ">="):
            return _Token("cmp", two, i, i + 2, two)
        if two in ("&&", "||"):
            return _Token("and" if two == "&&" else "or", two, i, i + 2)
        if c in _ONE_CHAR_TOKENS:
            return _Token(_ONE_CHAR_TOKENS[c], c, i, i + 1, "==" if c == "=" else c)
        if c in "&|":
            self.error(i, f"expected an operator, found '{c}': write '{c * 2}'")
        if c in "\"'":
            return self.string_token(i)
        if c in "0123456789." or (c == "-" and _NUMBER.match(text, i + 1)):
            return self.number_token(i)
        match = _WORD.match(text, i)
        if not match:  # the caller says what it expected instead
            return _Token("other", c, i, i + 1)
        word = match.group()
        kind = word.lower() if word.lower() in rr.RESERVED_WORDS else "word"
        return _Token(kind, word, i, match.end())

    def number_token(self, start: int) -> _Token:
        cursor, negative = self.pos, self.text[start] == "-"
        self.pos = start + negative
        number = self.number("a number")
        end, self.pos = self.pos, cursor  # peeking does not move the cursor
        value = rr.Number(-number.value if negative else number.value, number.unit)
        return _Token("num", self.text[start:end], start, end, value)

    def string_token(self, start: int) -> _Token:
        """A quoted string: either quote; a backslash takes the next character as it is."""
        quote, chars, i = self.text[start], [], start + 1
        while i < len(self.text) and self.text[i] != quote:
            if self.text[i] == "\\" and i + 1 < len(self.text):
                i += 1
            chars.append(self.text[i])
            i += 1
        if i >= len(self.text):
            self.error(start, f"expected a closing {quote} for the string that starts here, found end "
                              "of input")
        return _Token("str", self.text[start:i + 1], start, i + 1, "".join(chars))
