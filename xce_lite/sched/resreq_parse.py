"""The parser of the `-R` resource requirement language (syntax: the docstring of `resreq.py`).

One pass over the text with a cursor: the select section is lexed into tokens on demand, the other
sections are read character by character. Every error is a ResReqError whose message reads
`-R "<text>": at column N: expected ..., found ...` (N is 1-based and counts characters) and whose
`position` is N. Pure: no I/O.

The sections are read here; select[] by resreq_select.py; names, numbers and the errors by the
cursor (resreq_cursor.py).
"""

from __future__ import annotations

from collections.abc import Callable

from xce_lite.sched import resreq_values as rr
from xce_lite.sched.resreq_cursor import UNTIL_SEPARATOR, WORD
from xce_lite.sched.resreq_select import SelectParser

SECTIONS = ("select", "order", "rusage", "span", "same")
_SECTION_LIST = "select[...], order[...], rusage[...], span[...] or same[...]"
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


class _Parser(SelectParser):
    """The sections; select[] is SelectParser's, the reading of names and numbers the Cursor's."""

    # -------------------------------------------------------------- sections

    def parse(self) -> rr.ResReq:
        sections: dict[str, tuple[object, int]] = {}
        while True:
            self.skip_ws()
            if self.pos >= len(self.text):
                break
            start = self.pos
            match = WORD.match(self.text, start)
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
                bad = UNTIL_SEPARATOR.match(self.text, self.pos).group()  # type: ignore[union-attr]
                self.error(self.pos, f"expected an amount >= 0 after '{name}=', found '{bad}': rusage "
                                     "amounts cannot be negative")
            number = self.number(f"an amount after '{name}='")
            per = "task"
            self.skip_ws()
            if self.char() == "/":
                self.pos += 1
                self.skip_ws()
                match = WORD.match(self.text, self.pos)
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
