"""Rule names in a GBNF grammar, renamed: a grammar made part of another (its start symbol `root`
renamed, or all its rules prefixed, so that the two grammars' rules cannot meet).

The grammar is read as llama.cpp's parser reads it (src/llama-grammar.cpp), so that only a rule
name is renamed: never text inside a literal ("..."), a character class ([...]), a token
reference (<think>, <[42]>), a repetition's bounds ({2,5}) or a comment (# to the end of the
line). A request's own grammar (`grammar` with tools, or under a thinking model's think block)
may hold any of those; a grammar that does not parse is left for llama.cpp to refuse.
"""

from __future__ import annotations

import re
from typing import Callable

# what is copied as it stands (group 1), or a rule name (group 2: llama.cpp's word characters)
_PART = re.compile(r'("(?:[^"\\]|\\.)*"?|\[(?:[^\]\\]|\\.)*\]?|<[^>]*>?|\{[^}]*\}?|#[^\r\n]*)|([a-zA-Z0-9_-]+)',
                   re.DOTALL)


def renamed(gbnf: str, rename: Callable[[str], str]) -> str:
    """`gbnf` with each rule name, where defined and where used, replaced by `rename(name)`."""
    return _PART.sub(lambda m: m.group(1) or rename(m.group(2)), gbnf)


def renamed_root(gbnf: str, name: str) -> str:
    """`gbnf` with its start symbol `root` renamed `name` (a grammar that becomes part of
    another, whose own start symbol is `root`)."""
    return renamed(gbnf, lambda rule: name if rule == "root" else rule)


def prefixed_rules(gbnf: str, prefix: str) -> str:
    """`gbnf` with every rule name prefixed (its start symbol becomes `{prefix}root`)."""
    return renamed(gbnf, lambda rule: prefix + rule)
