"""engine/reasoning.py: a think block split from the answer, whole and as it streams (every way of
cutting the text into pieces gives what the whole text gives)."""

from __future__ import annotations

import re

import pytest

from appliance.engine import reasoning

TEXTS = [
    ("<think>\nFirst, 2 + 2.\n</think>\n\nIt is 4.", False, ("First, 2 + 2.", "It is 4.")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("No thinking here.", False, (None, "No thinking here.")),
    ("  plain with blanks ", False, (None, "  plain with blanks ")),
    ("<thinking aloud>", False, (None, "<thinking aloud>")),
    ("<thi", False, (None, "<thi")),
    ("<think>cut short </th", False, ("cut short </th", "")),
    ("\nreasoning first\n</think>\nanswer", True, ("reasoning first", "answer")),
    ("all reasoning   ", True, ("all reasoning", "")),
    ("</think>", True, ("", "")),
    ("<think></think>   ", False, ("", "")),
]


# Gemma 4's thought channel (its tags are control tokens, written out for this)
GEMMA4_TEXTS = [
    ("<|channel>thought\nFirst, 2 + 2.<channel|>It is 4.", False, ("First, 2 + 2.", "It is 4.")),
    ("<|channel>thought\ncut short <chan", False, ("cut short <chan", "")),
    ("It is 4.", False, (None, "It is 4.")),
    ("<|channel>", False, (None, "")),  # a control token: never answer text
    # an empty channel or a lone close after the answer: control tokens, never answer text
    ("<|channel>thought\nHm.<channel|>It is 4.<|channel>thought\n<channel|>", False, ("Hm.", "It is 4.\n")),
    ("<|channel>thought\nHm.<channel|>It is <4>.<channel|>", False, ("Hm.", "It is <4>.")),
    ("<|channel>thought\nHm.<channel|>Ends in <|chan", False, ("Hm.", "Ends in <|chan")),
]
# gpt-oss's harmony channels: analysis is the reasoning, final the answer (control tokens, written out)
HARMONY_TEXTS = [
    ("<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.", False,
     ("User asks 2+2.", "It is 4.")),
    ("<|channel|>final<|message|>It is 4.", False, (None, "It is 4.")),  # no analysis: the answer alone
    ("<|channel|>analysis<|message|>cut short <|e", False, ("cut short <|e", "")),
    ("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Ends in <|st", False,
     ("Hm.", "Ends in <|st")),
]
CASES = ([(*t, reasoning.THINK) for t in TEXTS] + [(*t, reasoning.GEMMA4) for t in GEMMA4_TEXTS]
         + [(*t, reasoning.HARMONY) for t in HARMONY_TEXTS])


@pytest.mark.parametrize("text,inside,want,tags", CASES)
def test_a_whole_answer_splits(text, inside, want, tags):
    assert reasoning.split(text, inside, tags) == want


@pytest.mark.parametrize("text,inside,want,tags", CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_streamed_pieces_add_up_to_the_whole_split(text, inside, want, tags, size):
    splitter = reasoning.Splitter(inside, tags)
    got_r = got_c = ""
    for i in range(0, len(text), size):
        r, c = splitter.push(text[i:i + size])
        got_r, got_c = got_r + r, got_c + c
    r, c = splitter.finish()
    got_r, got_c = got_r + r, got_c + c
    assert (got_r if want[0] is not None or got_r else None, got_c) == want


def test_it_applies_to_templates_with_think_tags_unless_turned_off():
    qwen3 = "{%- if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    assert reasoning.applies(qwen3, "auto") and reasoning.applies(qwen3, None)
    assert not reasoning.applies(qwen3, "none") and not reasoning.applies("{{ messages }}", "auto")
    assert reasoning.opened_by_prompt("<|im_start|>assistant\n<think>\n") and not reasoning.opened_by_prompt("x\n")
    gemma4 = "{{ '<|turn>model\\n' }}{% if not enable_thinking %}{{ '<|channel>thought\\n<channel|>' }}{% endif %}"
    assert reasoning.tags_of(gemma4) == reasoning.GEMMA4 and reasoning.tags_of(qwen3) == reasoning.THINK
    assert reasoning.tags_of("<|think|> {{ messages }}") is None  # Gemma 4's switch alone is no block


@pytest.mark.parametrize("size", [1, 4, 9])
def test_tool_calls_are_read_from_the_content_after_the_block(size):
    import msgspec

    from appliance.api import tools
    from appliance.api.chat_answer import AnswerShape
    from appliance.api.native_tools import NativeFormat
    from appliance.api.schemas import ChatRequest

    req = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "w"}}]}, ChatRequest)
    shape = AnswerShape(tools.plan(req, NativeFormat("hermes", 7)), think=reasoning.THINK)
    text = '<think>\nI should call w.\n</think>\n\nLet me.\n<tool_call>\n{"name": "w", "arguments": {}}\n</tool_call>'
    whole = shape.whole(text, "stop")
    assert (whole.reasoning, whole.content, whole.finish_reason) == ("I should call w.", "Let me.", "tool_calls")
    reader = shape.reader()
    got = [reader.push(text[i:i + size]) for i in range(0, len(text), size)]
    end = reader.finish("stop")
    assert "".join(r for r, _ in got) + (end.reasoning or "") == whole.reasoning
    assert "".join(c for _, c in got) + (end.content or "") == whole.content
    assert [c.function.name for c in end.tool_calls] == ["w"] and end.finish_reason == "tool_calls"


class TagVocab:
    """Tokenizes the tags below as one token each, anything else as one token a character."""

    TAGS = {"<think>": 900, "</think>": 901, "<|channel|>": 6, "<|message|>": 7, "<|end|>": 8, "<|start|>": 9}

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        out = []
        for part in re.split("(" + "|".join(map(re.escape, self.TAGS)) + ")", text):
            out += [self.TAGS[part]] if part in self.TAGS else [ord(c) for c in part]
        return out


def test_a_structured_answers_grammar_leaves_room_for_a_bounded_think_block():
    from appliance.engine import grammar
    from appliance.engine.schema_grammar import schema_to_gbnf

    schema = {"$defs": {"node": {"type": "object", "properties": {"root": {"type": "string", "enum": ["root"]},
                                                                   "next": {"$ref": "#"}}}}, "$ref": "#/$defs/node"}
    answer = schema_to_gbnf(schema)
    think = reasoning.thinking_grammar(TagVocab(), reasoning.THINK, answer, budget=50)
    lines = think.splitlines()
    assert lines[:2] == ["root ::= think-block? answer-root", "think-block ::= <[900]> !<[901]>{0,50} <[901]> [ \\t\\n]{0,8}"]
    assert not re.search(r"(?<![\w-])root(?![\w-])", "\n".join(lines[2:]).replace('"root"', "").replace('\\"root\\"', ""))
    grammar.check(None, think)
    harmony = reasoning.thinking_grammar(TagVocab(), reasoning.HARMONY, answer)  # no budget: unbounded
    assert harmony.startswith("root ::= think-block? <[6]> " + " ".join(f"<[{ord(c)}]>" for c in "final") + " <[7]> answer-root\n")
    assert "!<[8]>* <[8]> <[9]> \"assistant\"" in harmony
    grammar.check(None, harmony)
