"""The select[] section of the `-R` parser (resreq_parse.py): its tokens, lexed on demand after the
cursor, and a recursive descent over them (precedence: `!`, comparisons, `&&`, `||`). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from xce_lite.sched import resreq_values as rr
from xce_lite.sched.resreq_cursor import NUMBER, WORD, Cursor

_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ONE_CHAR_TOKENS = {"<": "cmp", ">": "cmp", "=": "cmp", "!": "not", "(": "lp", ")": "rp", "]": "end"}


@dataclass(frozen=True)
class _Token:
    kind: str  # cmp and or not lp rp end(']') eof word num str defined other
    text: str  # as written
    pos: int  # 0-based start
    end: int
    value: object = None  # cmp: the operator, `=` as `==`; num: an rr.Number; str: the decoded text


class SelectParser(Cursor):
    """select[...]'s expression, after the cursor; the rest of the parser derives from it."""

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
        if c in "0123456789." or (c == "-" and NUMBER.match(text, i + 1)):
            return self.number_token(i)
        match = WORD.match(text, i)
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
