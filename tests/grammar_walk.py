"""A text walked through a grammar token by token, as the runner walks an answer."""

from __future__ import annotations

from appliance.engine.grammar import Constraint


def accepts(vocab, gbnf: str, text: str, triggers: tuple = ()) -> bool:
    """Whether the grammar (lazy with `triggers`) lets `text`, tokenized by `vocab`, through to
    its end: every token allowed, then the end of generation."""
    c = Constraint(vocab, gbnf, triggers)
    try:
        for token in vocab.tokenize(text, add_special=False, parse_special=False):
            if not c.allows(token):
                return False
            c.accept(token)
        return c.allows(vocab.eos)
    finally:
        c.close()
