"""A JSON Schema `pattern` (an ECMA-262 regular expression) to a GBNF expression for the body of a
JSON string: what the model writes between the quotes, so characters that JSON escapes are
matched in their escaped form (a `"` in the pattern is `\\"` in the output, a newline `\\n`).

Supported: literals and escapes (\\d \\w \\s and their negations, \\t \\n \\r, \\xHH, \\uHHHH,
escaped punctuation), `.`, classes with ranges and negation, groups (capturing, `(?:...)` and
named), alternation, the quantifiers * + ? {n} {n,} {n,m} (lazy or not: the same language), and ^
and $ at the ends. JSON Schema's pattern matches anywhere in the string, so an end without its
anchor takes any characters there. Lookarounds, backreferences and word boundaries raise
RegexError: a grammar cannot hold them. `.` and negated classes never produce a quote, a
backslash or a control character (those would need JSON's escapes); write them in the pattern.
"""

from __future__ import annotations

import json

# Code points a JSON string cannot hold raw (quote, backslash, controls) and 0x7F, which the
# string grammar leaves out too.
SPECIAL = frozenset([0x22, 0x5C, 0x7F, *range(0x20)])
MAX_REPEAT = 2000  # llama.cpp's limit on a repetition's minimum
DIGITS = [(0x30, 0x39)]
WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
SPACE = [(0x09, 0x0D), (0x20, 0x20)]


class RegexError(ValueError):
    pass


def _gbnf_char(cp: int) -> str:
    """A code point inside a GBNF character class."""
    if cp < 0x80 and (chr(cp).isalnum() or chr(cp) in " _"):
        return chr(cp)
    return f"\\x{cp:02X}" if cp < 0x100 else (f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}")


def _json_form(cp: int) -> str:
    """How a JSON string holds the code point: itself, or its escape."""
    return json.dumps(chr(cp), ensure_ascii=False)[1:-1]


def _literal(text: str) -> str:
    out = "".join("\\" + c if c in '"\\' else c for c in text)
    return f'"{out}"'


def _ranges(ranges: list[tuple[int, int]]) -> str:
    """Code point ranges inside a GBNF character class."""
    return "".join(_gbnf_char(a) if a == b else f"{_gbnf_char(a)}-{_gbnf_char(b)}" for a, b in ranges)


def _class(ranges: list[tuple[int, int]], negated: bool, raw: bool = False) -> str:
    if negated:
        return f'[^{_ranges(ranges)}\\x3C]' if raw else f'[^{_ranges(ranges)}\\x22\\x5C\\x7F\\x00-\\x1F]'
    if raw:
        return f"[{_ranges(ranges)}]"
    plain: list[tuple[int, int]] = []
    escaped: list[int] = []
    for a, b in ranges:
        start = a
        for cp in sorted(c for c in SPECIAL if a <= c <= b):
            if start < cp:
                plain.append((start, cp - 1))
            escaped.append(cp)
            start = cp + 1
        if start <= b:
            plain.append((start, b))
    alts = []
    if plain:
        alts.append(f"[{_ranges(plain)}]")
    alts += [_literal(_json_form(cp)) for cp in sorted(set(escaped))]
    if not alts:
        raise RegexError("a class that matches nothing")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


class _Parser:
    def __init__(self, pattern: str, raw: bool = False):
        self.p = pattern
        self.i = 0
        self.raw = raw

    def char(self, cp: int) -> str:
        """One character of the pattern, as the output holds it."""
        if not self.raw:
            return _literal(_json_form(cp))
        return f'"\\x{cp:02X}"' if cp < 0x20 or cp == 0x7F else _literal(chr(cp))

    def cls(self, ranges: list[tuple[int, int]], negated: bool) -> str:
        return _class(ranges, negated, self.raw)

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def take(self) -> str:
        ch = self.peek()
        if not ch:
            raise RegexError("unexpected end of the pattern")
        self.i += 1
        return ch

    def alternation(self) -> str:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        return alts[0] if len(alts) == 1 else "(" + " | ".join(a or '""' for a in alts) + ")"

    def sequence(self) -> str:
        items = []
        while self.peek() and self.peek() not in "|)":
            if self.peek() in "^$":
                raise RegexError(f"{self.peek()!r} is supported only at the start or end of the pattern")
            atom = self.atom()
            items.append(self.quantified(atom))
        return " ".join(i for i in items if i)

    def quantified(self, atom: str) -> str:
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.i += 1
            suffix = ch
        elif ch == "{" and self._is_bound():
            self.i += 1
            lo_text = self._digits()
            hi_text: str | None = lo_text
            if self.peek() == ",":
                self.i += 1
                hi_text = self._digits() or None
            if self.take() != "}":
                raise RegexError("a bound must end with }")
            lo, hi = int(lo_text), (int(hi_text) if hi_text is not None else None)
            if lo > MAX_REPEAT or (hi is not None and hi < lo):
                raise RegexError(f"the bound {{{lo_text},{hi_text or ''}}} is not supported")
            suffix = f"{{{lo}}}" if hi == lo else (f"{{{lo},}}" if hi is None else f"{{{lo},{min(hi, MAX_REPEAT)}}}")
        else:
            return atom
        if self.peek() == "?":  # lazy: the same strings
            self.i += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self._is_bound()):
            raise RegexError("a quantifier cannot follow a quantifier")
        return f"({atom}){suffix}"

    def _is_bound(self) -> bool:
        j = self.i + 1
        while j < len(self.p) and (self.p[j].isdigit() or self.p[j] == ","):
            j += 1
        return j < len(self.p) and self.p[j] == "}" and self.p[self.i + 1 : self.i + 2].isdigit()

    def _digits(self) -> str:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        return self.p[start : self.i]

    def atom(self) -> str:
        ch = self.take()
        if ch == "(":
            if self.peek() == "?":
                self.i += 1
                kind = self.take()
                if kind == "<" and self.peek() not in "=!":  # a named group
                    while self.take() != ">":
                        pass
                elif kind == "P" and self.peek() == "<":
                    while self.take() != ">":
                        pass
                elif kind != ":":
                    raise RegexError("lookarounds are not supported")
            inner = self.alternation()
            if self.take() != ")":
                raise RegexError("unbalanced parenthesis")
            return f"({inner})" if inner else '""'
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return self.cls([(0x0A, 0x0A), (0x0D, 0x0D)], negated=True)
        if ch == "\\":
            ranges, negated, lit = self.escape(in_class=False)
            if lit is not None:
                return self.char(lit)
            return self.cls(ranges, negated)
        if ch in "*+?":
            raise RegexError(f"nothing to repeat before {ch!r}")
        if ch == ")":
            raise RegexError("unbalanced parenthesis")
        return self.char(ord(ch))

    def escape(self, in_class: bool) -> tuple[list[tuple[int, int]], bool, int | None]:
        """(ranges, negated, None) for a class escape, or ([], False, code point) for a character."""
        ch = self.take()
        classes = {"d": DIGITS, "w": WORD, "s": SPACE}
        if ch.lower() in classes:
            return classes[ch.lower()], ch.isupper(), None
        simple = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}
        if ch in simple:
            return [], False, simple[ch]
        if ch in "xu":
            width = 2 if ch == "x" else 4
            digits = self.p[self.i : self.i + width]
            if len(digits) != width or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise RegexError(f"\\{ch} needs {width} hex digits")
            self.i += width
            return [], False, int(digits, 16)
        if ch.isdigit() or ch in "bBk":
            raise RegexError(f"\\{ch} (a backreference or word boundary) is not supported")
        if ch.isalnum():
            raise RegexError(f"unknown escape \\{ch}")
        return [], False, ord(ch)

    def char_class(self) -> str:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        negated_parts: list[list[tuple[int, int]]] = []
        first = True
        while first or self.peek() != "]":
            first = False
            ch = self.take()
            if ch == "\\":
                sub, sub_negated, lit = self.escape(in_class=True)
                if lit is None:
                    if sub_negated:
                        negated_parts.append(sub)
                    else:
                        ranges += sub
                    continue
                lo = lit
            else:
                lo = ord(ch)
            if self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi_ch = self.take()
                hi = ord(hi_ch) if hi_ch != "\\" else self.escape(in_class=True)[2]
                if hi is None or hi < lo:
                    raise RegexError("a bad range in a class")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        self.i += 1  # ]
        if negated_parts:
            raise RegexError("\\D, \\W and \\S inside a class are not supported")
        return self.cls(ranges, negated)


def pattern_gbnf(pattern: str, raw: bool = False) -> tuple[str, bool, bool]:
    """(GBNF expression, starts anywhere, ends anywhere) for a JSON string body matching
    `pattern`; the caller puts any characters (its `char*`) at an unanchored end. `raw`: for the
    string as raw text (a tool-call format that writes it so, between tags): characters are
    themselves, and `.` and negated classes never produce a `<`, so they cannot spell an end tag."""
    body = pattern
    anchored_start = body.startswith("^")
    if anchored_start:
        body = body[1:]
    anchored_end = body.endswith("$") and not body.endswith("\\$")
    if anchored_end:
        body = body[:-1]
    parser = _Parser(body, raw)
    expr = parser.alternation()
    if parser.i != len(body):
        raise RegexError("unbalanced parenthesis")
    return expr or '""', not anchored_start, not anchored_end
