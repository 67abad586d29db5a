"""A lazy grammar started by a text trigger (engine/grammar.Constraint): free until the text is
written, in any spelling of tokens, then held from where the text begins; a trigger the grammar
refuses to go on from is not one."""

from __future__ import annotations

import pytest

from appliance.engine.grammar import Constraint

CALL = 'root ::= "<function name=\\"" [a-z]+ "\\">" [0-9]+ "</function>"\n'
TRIGGER = '<function name="'


@pytest.fixture(scope="module")
def vocab(smollm2_vocab):
    return smollm2_vocab


@pytest.fixture
def c(vocab):
    """The call grammar, lazy with the text trigger."""
    constraint = Constraint(vocab, CALL, (TRIGGER,))
    yield constraint
    constraint.close()


def walk(vocab, c: Constraint, tokens: list[int]) -> list[bool]:
    """Each token's verdict, accepting those allowed (as the runner does with the ones it picks)."""
    out = []
    for t in tokens:
        ok = c.allows(t)
        out.append(ok)
        if ok:
            c.accept(t)
    return out


def pieces(vocab, *texts: str) -> list[int]:
    """The tokens of each text in turn (a spelling the model might write)."""
    return [t for text in texts for t in vocab.tokenize(text, add_special=False, parse_special=False)]


def test_text_before_the_trigger_is_free_and_the_call_after_it_is_held(vocab, c):
    assert all(walk(vocab, c, pieces(vocab, "Let me look that up. <", "function", ' name="')))
    assert not c.waiting
    (digit,) = pieces(vocab, "7")
    (word,) = pieces(vocab, "abc")
    assert c.allows(word) and not c.allows(digit)  # the name, then
    c.accept(word)
    for text, ok in (('">', True), ("x", False), ("42", True), ("</function>", True)):
        assert all(walk(vocab, c, pieces(vocab, text))) is ok, text
    assert c.allows(vocab.eos)


def test_the_token_that_completes_the_trigger_may_carry_text_before_and_after_it(vocab, c):
    walk(vocab, c, pieces(vocab, "ok"))
    c._watch(b'.<function name="ab')  # one piece with prose before the tag and the name's start after
    assert not c.waiting
    assert all(walk(vocab, c, pieces(vocab, 'c">1</function>')))
    assert c.allows(vocab.eos)


def test_a_trigger_whose_piece_goes_on_where_the_grammar_cannot_is_prose_and_the_next_one_counts(vocab, c):
    c._watch(b'Write <function name="X"> to call.')  # an uppercase name, in the same piece: refused
    assert c.waiting
    walk(vocab, c, pieces(vocab, ' Now: <function name="get">'))
    assert not c.waiting
    assert all(walk(vocab, c, pieces(vocab, "5</function>")))
    assert c.allows(vocab.eos)


def test_token_and_text_triggers_do_not_mix(vocab):
    with pytest.raises(ValueError):
        Constraint(vocab, CALL, (3, TRIGGER))
