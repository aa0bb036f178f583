"""The cursor of the `-R` parser (resreq_parse.py): the text, a position in it, the errors that
name the column (`-R "<text>": at column N: expected ..., found ...`), and the reading of the
lexical pieces every section shares: names, numbers with units, whole numbers. Pure.
"""

from __future__ import annotations

import re
from typing import NoReturn

from xce_lite.sched import resreq_values as rr

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:([KMGTkmgt])[Bb]?|([Bb]))?")
WHOLE = re.compile(r"-?[0-9]+")
WORD_CHAR = re.compile(r"[A-Za-z0-9_.]")
UNTIL_SEPARATOR = re.compile(r"[^\s,:\]/]*")


class Cursor:
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
        match = WORD.match(self.text, pos) or NUMBER.match(self.text, pos)
        return f"'{match.group() if match else self.text[pos]}'"

    def expect(self, pos: int, what: str) -> NoReturn:
        self.error(pos, f"expected {what}, found {self.found(pos)}")

    def name(self, what: str) -> tuple[str, int]:
        start = self.pos
        match = WORD.match(self.text, start)
        if not match:
            self.expect(start, what)
        if match.group().lower() in rr.RESERVED_WORDS:
            self.error(start, f"expected {what}, found '{match.group()}', which is a reserved word")
        self.pos = match.end()
        return match.group(), start

    def number(self, what: str) -> rr.Number:
        """An unsigned number with an optional unit; callers deal with a sign."""
        start = self.pos
        match = NUMBER.match(self.text, start)
        if not match:
            self.expect(start, what)
        self.pos = match.end()
        if WORD_CHAR.match(self.char()):
            self.expect(self.pos, "a unit (K, M, G or T) or the end of the number")
        digits, unit = match.group(1), match.group(2) or match.group(3)
        try:
            value: int | float = float(digits) if "." in digits else int(digits)
        except ValueError:  # more digits than int() takes
            self.error(start, f"expected a number of at most 4300 digits, found {digits[:20]}...")
        return rr.Number(value, unit.upper() if unit else None)

    def whole_number(self, what: str) -> tuple[int, int]:
        start = self.pos
        match = WHOLE.match(self.text, start)
        if not match or WORD_CHAR.match(self.text[match.end():match.end() + 1] or " "):
            bad = UNTIL_SEPARATOR.match(self.text, start).group()  # type: ignore[union-attr]
            self.error(start, f"expected {what}, found " + (f"'{bad}'" if bad else self.found(start)))
        self.pos = match.end()
        return int(match.group()), start

    def expect_char(self, char: str, what: str) -> None:
        self.skip_ws()
        if self.char() != char:
            self.expect(self.pos, what)
        self.pos += 1
