"""JSON Schema to GBNF (engine/schema_grammar.py), checked by llama.cpp's own grammar engine:
each text is tokenized with SmolLM2's vocabulary and walked through a Constraint token by token,
as the runner does, and counts as accepted when every token is allowed and the end may follow."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from appliance.engine import grammar
from appliance.engine.grammar import TOKEN_DATA, Constraint, GrammarError, best_in_shortlist, redraw
from appliance.engine.schema_grammar import SchemaError, integer_range, json_object_gbnf, schema_to_gbnf
from grammar_walk import accepts


@pytest.fixture(scope="module")
def vocab(smollm2_vocab):
    return smollm2_vocab



def test_json_object_takes_objects_and_nothing_else(vocab):
    g = json_object_gbnf()
    for text in ['{}', '{"a": 1}', '{"a": [1, 2.5, -3e10, "x\\n\\u00e9", true, null, {"b": {}}]}', '{\n  "k": "v"\n}']:
        assert accepts(vocab, g, text), text
        json.loads(text)
    for text in ['[]', '"x"', '{"a": 1', '{"a": 01}', '{"a": "line\nbreak"}', "{'a': 1}", '{"a": 1}}', '{"a": 1} x']:
        assert not accepts(vocab, g, text), text


def test_every_number_the_grammar_spells_is_a_finite_double(vocab):
    """An exponent up to 289 (with 16 digits before the point the largest is about 1e305): before,
    up to 999, so an answer could hold 9e999, which msgspec refuses and json reads as infinity."""
    g = schema_to_gbnf({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]})
    for x in ("1e99", "-2.5E+289", "9999999999999999.9999999999999999e289", "1e-289", "0", "7e07"):
        assert accepts(vocab, g, f'{{"x": {x}}}'), x
        assert msgspec.json.decode(f'{{"x": {x}}}'.encode())["x"] == float(x)
    for x in ("9e999", "1e290", "1e300", "1e1000", "1e0001"):
        assert not accepts(vocab, g, f'{{"x": {x}}}'), x
    assert accepts(vocab, json_object_gbnf(), '{"a": [1e289]}') and not accepts(vocab, json_object_gbnf(), '{"a": [1e999]}')


def test_properties_in_order_with_required_ones_always_there(vocab):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}, "d": {"type": "null"}},
        "required": ["b", "d"],
    }
    g = schema_to_gbnf(schema)
    full = {"a": 1, "b": "x", "c": True, "d": None}
    for keep in range(16):
        obj = {k: v for i, (k, v) in enumerate(full.items()) if keep >> i & 1}
        valid = "b" in obj and "d" in obj
        assert accepts(vocab, g, json.dumps(obj)) == valid, obj
    assert not accepts(vocab, g, '{"d": null, "b": "x"}')  # declared order only
    assert not accepts(vocab, g, '{"b": "x", "d": null, "e": 1}')  # no others without additionalProperties
    assert not accepts(vocab, g, '{"b": 2, "d": null}')


def test_additional_properties_follow_their_schema(vocab):
    g = schema_to_gbnf({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                        "additionalProperties": {"type": "string"}})
    assert accepts(vocab, g, '{"id": 1, "x": "a", "y": "b"}')
    assert not accepts(vocab, g, '{"id": 1, "x": 2}')
    only = schema_to_gbnf({"type": "object", "additionalProperties": {"type": "integer"}})
    assert accepts(vocab, only, '{}') and accepts(vocab, only, '{"p": 1, "q": 2}')
    assert not accepts(vocab, only, '{"p": true}')


@pytest.mark.parametrize("lo,hi", [(0, 120), (-5, 7), (-40, -3), (95, 1005), (7, 7), (None, -98), (98, None)])
def test_integer_ranges_are_exact(vocab, lo, hi):
    g = schema_to_gbnf({"type": "integer", **({"minimum": lo} if lo is not None else {}),
                        **({"maximum": hi} if hi is not None else {})})
    start = (lo if lo is not None else hi) - 12
    end = (hi if hi is not None else lo) + 12
    for n in range(start, end + 1):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert accepts(vocab, g, str(n)) == inside, (n, integer_range(lo, hi))
    assert not accepts(vocab, g, "007") and not accepts(vocab, g, "1.5")


def test_exclusive_and_fractional_bounds(vocab):
    g = schema_to_gbnf({"type": "integer", "exclusiveMinimum": 2, "maximum": 5.5})
    assert [n for n in range(0, 9) if accepts(vocab, g, str(n))] == [3, 4, 5]
    draft4 = schema_to_gbnf({"type": "integer", "minimum": 2, "exclusiveMinimum": True, "maximum": 4, "exclusiveMaximum": True})
    assert [n for n in range(0, 9) if accepts(vocab, draft4, str(n))] == [3]


def test_arrays_strings_enums_and_formats(vocab):
    arr = schema_to_gbnf({"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 3})
    assert accepts(vocab, arr, '["a", "bc", "def"]')
    assert not accepts(vocab, arr, '[]') and not accepts(vocab, arr, '["a", "b", "c", "d"]')
    assert not accepts(vocab, arr, '["abcd"]')
    tup = schema_to_gbnf({"type": "array", "prefixItems": [{"type": "integer"}, {"enum": ["x", "y"]}]})
    assert accepts(vocab, tup, '[1, "y"]') and not accepts(vocab, tup, '[1, "z"]') and not accepts(vocab, tup, '[1]')
    lengths = schema_to_gbnf({"type": "string", "minLength": 2, "maxLength": 4})
    assert [n for n in range(0, 7) if accepts(vocab, lengths, json.dumps("é" * n))] == [2, 3, 4]
    enum = schema_to_gbnf({"enum": ["red", 3, None, {"k": [1]}]})
    for v in ["red", 3, None, {"k": [1]}]:
        assert accepts(vocab, enum, json.dumps(v))
    assert not accepts(vocab, enum, '"blue"')
    const = schema_to_gbnf({"const": 'say "hi"\n'})
    assert accepts(vocab, const, json.dumps('say "hi"\n'))
    date = schema_to_gbnf({"type": "string", "format": "date-time"})
    assert accepts(vocab, date, '"2026-12-03T15:31:31Z"') and accepts(vocab, date, '"2026-12-03T15:31:31.25+01:00"')
    assert not accepts(vocab, date, '"2026-13-03T15:31:31Z"') and not accepts(vocab, date, '"yesterday"')
    uuid = schema_to_gbnf({"type": "string", "format": "uuid"})
    assert accepts(vocab, uuid, '"123e4567-e89b-12d3-a456-426614174000"') and not accepts(vocab, uuid, '"123e4567"')
    assert accepts(vocab, schema_to_gbnf({"type": "string", "format": "email"}), '"any text"')  # an annotation


def test_unions_nullable_and_recursive_refs(vocab):
    opt = schema_to_gbnf({"anyOf": [{"type": "integer"}, {"type": "null"}]})  # pydantic's Optional[int]
    assert accepts(vocab, opt, "5") and accepts(vocab, opt, "null") and not accepts(vocab, opt, '"5"')
    assert accepts(vocab, schema_to_gbnf({"type": "string", "nullable": True}), "null")
    types = schema_to_gbnf({"type": ["boolean", "string"], "maxLength": 1})
    assert accepts(vocab, types, "true") and accepts(vocab, types, '"a"') and not accepts(vocab, types, '"ab"')
    tree = {
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                           "required": ["v", "kids"]}},
        "$ref": "#/$defs/node",
    }
    g = schema_to_gbnf(tree)
    assert accepts(vocab, g, '{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]}')
    assert not accepts(vocab, g, '{"v": 1, "kids": [{"v": 2}]}')
    wrapped = schema_to_gbnf({"allOf": [{"$ref": "#/definitions/c"}], "definitions": {"c": {"enum": ["a"]}}})
    assert accepts(vocab, wrapped, '"a"')


def test_keywords_beside_ref_unions_and_enums_hold_too(vocab):
    # they were dropped: answers with finish_reason stop broke the schema
    spread = schema_to_gbnf({"type": "string", "anyOf": [{"maxLength": 3}, {"minLength": 5}]})
    assert accepts(vocab, spread, '"ab"') and accepts(vocab, spread, '"abcdef"')
    assert not accepts(vocab, spread, "12") and not accepts(vocab, spread, '"abcd"')
    met = schema_to_gbnf({"type": ["string", "null"], "anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]})
    assert accepts(vocab, met, '"ab"') and not accepts(vocab, met, '"abc"') and not accepts(vocab, met, "1")
    defs = {"a": {"type": "integer"}}
    bounded = schema_to_gbnf({"$defs": defs, "type": "object", "required": ["v"],
                              "properties": {"v": {"$ref": "#/$defs/a", "minimum": 5, "maximum": 7, "title": "V"}}})
    assert accepts(vocab, bounded, '{"v": 6}') and not accepts(vocab, bounded, '{"v": 1}')
    maybe = schema_to_gbnf({"$defs": defs, "$ref": "#/$defs/a", "nullable": True})
    assert accepts(vocab, maybe, "null") and accepts(vocab, maybe, "3") and not accepts(vocab, maybe, '"3"')
    typed = schema_to_gbnf({"type": "string", "enum": ["a", 1], "description": "one of them"})
    assert accepts(vocab, typed, '"a"') and not accepts(vocab, typed, "1")
    assert accepts(vocab, schema_to_gbnf({"type": "number", "const": 2}), "2")


def test_the_output_ends_at_the_value(vocab):
    for schema in ({"type": "object"}, {"type": "integer"}, {}, {"type": ["string", "null"]}):
        g = schema_to_gbnf(schema)
        assert not accepts(vocab, g, '{} ' if schema.get("type") == "object" else "1 \n"), schema
    assert accepts(vocab, schema_to_gbnf({"type": "object"}), '{ "a" : 1 }')  # inside, whitespace is free


@pytest.mark.parametrize("schema,path", [
    ({"type": "string", "pattern": "^(?=a)a+$"}, "pattern"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "pattern"),
    ({"type": "string", "pattern": "^a+", "maxLength": 3}, "maxLength"),
    ({"properties": {"x": {"type": "number", "minimum": 0}}}, "properties.x.minimum"),
    ({"type": "array", "items": {"not": {"type": "null"}}}, "items.not"),
    ({"anyOf": [{"type": "integer"}, {"type": "strng"}]}, "anyOf.1.type"),
    ({"$ref": "#/$defs/missing"}, "$ref"),
    ({"$ref": "other.json#/x"}, "$ref"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "required"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "maxItems"),
    ({"type": "string", "minLength": 5000}, "minLength"),
    ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, "allOf"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"$defs": {"a": {"$anchor": "foo", "type": "integer"}}, "$ref": "#foo"}, "$ref"),
    ({"$dynamicRef": "#node"}, "$dynamicRef"),
    ({"enum": ["a", "bc"], "minLength": 2}, "minLength"),
    ({"type": "integer", "enum": ["a"]}, "enum"),
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "type": "string"}, "$ref"),
    ({"$defs": {"a": {"type": "integer", "minimum": 1}}, "$ref": "#/$defs/a", "minimum": 2}, "$ref.minimum"),
    ({"type": "string", "anyOf": [{"type": "integer"}, {"type": "null"}]}, "anyOf"),
    (False, ""),
    ({"type": "integer", "minimum": 5, "maximum": 4}, ""),
])
def test_what_the_grammar_cannot_enforce_is_refused_by_path(schema, path):
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf(schema)
    assert e.value.path == path


def test_llama_cpp_compiles_what_it_is_given_or_says_no(vocab):
    grammar.check(vocab, 'root ::= "a" [0-9]+')
    grammar.check(None, 'root ::= "a"')  # no vocabulary: still a syntax check
    for bad in ('root ::= nothing', 'start ::= "a"', 'root ::= root "a"', 'root ::= "a'):
        with pytest.raises(GrammarError):
            grammar.check(vocab, bad)
    with pytest.raises(GrammarError):
        grammar.check(None, "root ::= <|im_end|>")  # a token named by its text needs a vocabulary
    grammar.check(vocab, "root ::= <|im_end|>")


def test_the_shortlist_pick_is_the_greedy_token_of_the_whole_vocabulary_masked(vocab):
    """A refused greedy token is looked for among the 64 highest logits first (grammar.py,
    best_in_shortlist); when that decides it, it must be the token a mask of the whole vocabulary
    gives, ties included."""
    rng = np.random.default_rng(0)
    digits = vocab.tokenize("0123456789", add_special=False, parse_special=False)
    shortlisted = masked = 0
    for trial in range(60):
        logits = rng.normal(size=vocab.n_vocab).astype(np.float32)
        if trial % 3 == 1:  # an allowed token among the best, below refused ones
            logits[digits[trial % len(digits)]] = logits.max() - 0.5
        if trial % 3 == 2:  # every allowed token tied with 200 refused ones across the 64th highest logit
            boundary = np.sort(logits)[-40]
            logits[rng.choice(vocab.n_vocab, 200, replace=False)] = boundary
            logits[digits] = boundary
        c = Constraint(vocab, "root ::= [0-9]+")  # most of the vocabulary is refused
        whole = np.zeros(vocab.n_vocab, dtype=TOKEN_DATA)
        whole["id"] = np.arange(vocab.n_vocab)
        whole["logit"] = logits
        assert c.mask(whole)
        got = best_in_shortlist(c, logits)
        c.close()
        if got is None:
            masked += 1
        else:
            shortlisted += 1
            assert got == int(whole["logit"].argmax()), trial
    assert shortlisted >= 20 and masked >= 20  # both ways were taken


def test_a_refused_draw_redrawn_gives_the_distribution_masked(vocab):
    """First draw from p; if the grammar refuses it, redraw (grammar.py): each allowed token must
    come out with p(t) / Z. 20000 draws over 30 candidates, 10 of them allowed."""
    rng = np.random.default_rng(1)
    digits = vocab.tokenize("0123456789", add_special=False, parse_special=False)
    letters = vocab.tokenize("a b c d e f g h i j k l m n o p q r s t", add_special=False, parse_special=False)[:20]
    kept = np.zeros(30, dtype=TOKEN_DATA)
    kept["id"] = rng.permutation(list(digits) + list(letters))
    kept["p"] = rng.dirichlet(np.ones(30))
    c = Constraint(vocab, "root ::= [0-9]+")
    allowed = np.isin(kept["id"], digits)
    counts = np.zeros(30)
    for _ in range(20000):
        i = int(rng.choice(30, p=kept["p"] / kept["p"].sum()))
        token = int(kept["id"][i]) if c.allows(int(kept["id"][i])) else redraw(c, kept, i, rng)
        counts[np.flatnonzero(kept["id"] == token)[0]] += 1
    c.close()
    assert counts[~allowed].sum() == 0
    expected = 20000 * kept["p"][allowed] / kept["p"][allowed].sum()
    chi2 = float((((counts[allowed] - expected) ** 2) / expected).sum())
    assert chi2 < 27.9, (chi2, counts[allowed], expected)  # 9 degrees of freedom, p = 0.001


def test_a_redraw_gives_up_when_the_chain_kept_nothing_allowed(vocab):
    kept = np.zeros(3, dtype=TOKEN_DATA)
    kept["id"] = vocab.tokenize("a b c", add_special=False, parse_special=False)[:3]
    kept["p"] = [0.5, 0.3, 0.2]
    c = Constraint(vocab, "root ::= [0-9]+")
    assert redraw(c, kept, 0, np.random.default_rng(0)) is None
    c.close()


@pytest.mark.parametrize("pattern,good,bad", [
    (r"^[A-Z]{2}-\d{3,4}(x|yz)?$", ["AB-123", "AB-1234x", "XY-999yz"], ["ab-123", "AB-12", "AB-12345", "AB-123z"]),
    ('ab"c', ['xxab"cyy', 'ab"c'], ["abc", 'ab"'] ),  # unanchored: anything around it
    (r'^[a"\\\n]+$', ['a"\\\n', "aa"], ["b", ""]),  # a quote, a backslash, a newline: in JSON's escapes
    (r"^.{3}$", ["abc", "é!x"], ["ab", "a\nb"]),
    (r"^[^0-9]+$", ["abc", "x y"], ["a1", ""]),
    (r"^(?:ab|c)*\.(?<ext>png|jpe?g)$", ["abc.png", ".jpg", "c.jpeg"], ["abd.png", "ab.gif"]),
    (r"^\s\w\S$", [" a!", "\tZ_"], ["  a", "a a"]),
    (r"^\x41\u00e9[\-+]$", ["Aé-", "Aé+"], ["Ae-", "Aé*"]),
])
def test_patterns_match_the_json_text_of_their_strings(vocab, pattern, good, bad):
    g = schema_to_gbnf({"type": "string", "pattern": pattern})
    for text in good:
        assert accepts(vocab, g, json.dumps(text, ensure_ascii=False)), (pattern, text)
    for text in bad:
        assert not accepts(vocab, g, json.dumps(text, ensure_ascii=False)), (pattern, text)


@pytest.mark.parametrize("pattern", ["(?!a)b", "(a)\\1", "a\\b", "(a", "a)", "*a", "a{2,1}", "a**", "[b-a]", "\\q"])
def test_patterns_a_grammar_cannot_hold_are_refused(pattern):
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf({"type": "string", "pattern": pattern})
    assert e.value.path == "pattern"


def test_a_date_has_a_day_its_month_has(vocab):
    date = schema_to_gbnf({"type": "string", "format": "date"})
    for good in ("2023-01-31", "2023-04-30", "2024-02-29", "2023-12-31"):
        assert accepts(vocab, date, f'"{good}"'), good
    for bad in ("2023-02-30", "2023-02-31", "2023-04-31", "2023-11-31", "2023-13-01", "2023-00-10", "2023-06-00"):
        assert not accepts(vocab, date, f'"{bad}"'), bad


def test_february_29_only_in_leap_years(vocab):
    import calendar
    date = schema_to_gbnf({"type": "string", "format": "date"})
    years = [0, 4, 100, 400, 1900, 1996, 2000, 2023, 2024, 2100, 2400, 2800, 9996, 9999] + list(range(1901, 1913))
    for year in years:
        day = f"{year:04d}-02-29"
        assert accepts(vocab, date, f'"{day}"') == calendar.isleap(year), day
        assert accepts(vocab, date, f'"{year:04d}-02-28"'), year
    with_time = schema_to_gbnf({"type": "string", "format": "date-time"})
    assert accepts(vocab, with_time, '"2024-02-29T12:00:00Z"')
    assert not accepts(vocab, with_time, '"2023-02-29T12:00:00Z"')


def test_a_surrogate_escape_comes_only_as_a_pair(vocab):
    # a lone one is no character: strict parsers refuse it, and the reply's UTF-8 encoding failed
    # on it (a 500 where a tool-enabled answer held one)
    s = schema_to_gbnf({"type": "string"})
    for good in ('"\\ud83d\\ude00"', '"\\u00e9 \\uD7FF \\uE000"', '"\\uD83D\\uDE00!"'):
        assert accepts(vocab, s, good), good
    for bad in ('"\\ud83d"', '"\\ude00"', '"\\ud83d\\u0041"', '"\\ud83d x"'):
        assert not accepts(vocab, s, bad), bad
