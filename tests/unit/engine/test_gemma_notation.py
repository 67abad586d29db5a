"""engine/gemma_notation.py: Gemma 4's argument notation read and written, and its grammar for a
schema (compiled by llama.cpp's grammar parser)."""

from __future__ import annotations

import pytest

from appliance.engine import gemma_notation as g
from appliance.engine import grammar
from appliance.engine.schema_grammar import SchemaError, literal

QUOTE = literal(g.QUOTE)


def test_values_read_and_write_as_the_template_writes_them():
    value = {"b": [1, -2.5, "x, y"], "a": {"k": None, "t": True, "f": False}, "s": "Paris: {not} [a] value"}
    text = g.write(value)
    assert text == '{a:{f:false,k:null,t:true},b:[1,-2.5,<|"|>x, y<|"|>],s:<|"|>Paris: {not} [a] value<|"|>}'
    assert g.read(text) == value
    assert g.read("{x:None,n:1e3,e:{},l:[]}") == {"x": None, "n": 1000.0, "e": {}, "l": []}  # Python's None too


@pytest.mark.parametrize("text", ["{a:1", "{a:<|\"|>x}", "{a 1}", "[1,2", "{a:1}x", "", "{:1}", "nope"])
def test_text_that_is_not_a_value_does_not_read(text):
    with pytest.raises(g.NotationError):
        g.read(text)


def grammar_of(schema: dict) -> str:
    rules, (top,) = g.schemas_gbnf([schema], "args", QUOTE)
    text = f"root ::= {top}\n{rules}"
    grammar.check(None, text)
    return text


def test_an_objects_keys_come_sorted_and_the_required_ones_always():
    text = grammar_of({"type": "object", "properties": {"z": {"type": "integer", "minimum": 0, "maximum": 9},
                                                        "a": {"type": "string", "maxLength": 3},
                                                        "m": {"enum": ["x", "y"]}}, "required": ["z"]})
    lines = text.splitlines()
    assert lines[0] == "root ::= args-0"
    # a, then m, then z: optional ones may be left out, z never
    assert 'args-0 ::= "{" ("a:" args-0-a-string args-0-after-1 | ("m:" args-0-m args-0-after-2 | "z:" args-0-z-int)) "}"' in lines
    assert 'args-0-after-1 ::= ("," "m:" args-0-m)? args-0-after-2' in lines
    assert 'args-0-after-2 ::= "," "z:" args-0-z-int' in lines
    assert 'args-0-a-string ::= "<|\\"|>" g-char{0,3} "<|\\"|>"' in lines  # maxLength, in characters
    assert 'args-0-m ::= "<|\\"|>" "x" "<|\\"|>" | "<|\\"|>" "y" "<|\\"|>"' in lines
    assert "args-0-z-int ::= [0-9]" in lines


def test_local_refs_and_lists_and_alternatives_convert():
    grammar_of({"type": "object", "properties": {"n": {"$ref": "#/$defs/node"}}, "$defs": {"node": {
        "type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                                         "v": {"anyOf": [{"type": "number"}, {"type": "null"}]}}}}})


def test_keywords_the_grammar_cannot_hold_are_refused_by_path():
    with pytest.raises(SchemaError) as e:
        g.schemas_gbnf([{"type": "object"}, {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}],
                       "args", QUOTE)
    assert e.value.path == "1.properties.n.multipleOf"
