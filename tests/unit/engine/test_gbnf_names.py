"""engine/gbnf_names.py: a grammar's rule names renamed, and nothing else in it, as llama.cpp
reads the grammar; checked by llama.cpp's own parser (a grammar whose rules were renamed in
the wrong places would not compile or would take other text)."""

from __future__ import annotations

import pytest

from appliance.engine import grammar
from appliance.engine.gbnf_names import prefixed_rules, renamed_root

# rule names inside a literal, a character class, a repetition, a comment and a token reference
TRICKY = '''# the "root of it: word ::= [
root ::= word ("," ws word){0,3} # root again, [unclosed
word ::= "root" | "a-b" | [a-z\\]root]+ | "say \\"word\\""
ws   ::= [ \\t]*  # { not a repetition
'''


def test_only_rule_names_are_renamed():
    prefixed = prefixed_rules(TRICKY, "x-")
    # every rule name, defined or used, and nothing else: the whole text as it should read
    assert prefixed == (TRICKY.replace("\nroot ::= word (\",\" ws word)", "\nx-root ::= x-word (\",\" x-ws x-word)")
                        .replace("\nword ::=", "\nx-word ::=").replace("\nws   ::=", "\nx-ws   ::="))
    assert renamed_root(TRICKY, "answer") == TRICKY.replace("\nroot ::=", "\nanswer ::=")
    grammar.check(None, TRICKY)
    grammar.check(None, "root ::= x-root\n" + prefixed)


def test_token_references_are_left_as_they_are():
    text = 'root ::= <think> body </think> !<[42]>{1,3}\nbody ::= [^<]*'
    assert prefixed_rules(text, "p-") == 'p-root ::= <think> p-body </think> !<[42]>{1,3}\np-body ::= [^<]*'


@pytest.mark.parametrize("text", ['root ::= "unclosed', "root ::= [a-", "root ::= <tok"])
def test_a_grammar_that_does_not_parse_is_left_for_llama_cpp_to_refuse(text):
    renamed = prefixed_rules(text, "p-")
    assert renamed.startswith("p-root ::= ")
    with pytest.raises(grammar.GrammarError):
        grammar.check(None, "root ::= p-root\n" + renamed)
