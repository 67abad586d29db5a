"""Completions' text_offset counts the text's characters: a character split across tokens (each
piece shown as U+FFFD) counts once, where the offsets drifted by a character for every piece."""

from __future__ import annotations

from appliance.api.openai_routes import completion_logprobs
from appliance.engine.runner import TokenLogprob


def test_a_character_split_across_tokens_counts_once():
    pieces = [b"Hi ", b"\xf0\x9f", b"\x8c\x9f", b" x", b"\xc3\xa9"]  # "Hi 🌟 xé"
    lp = completion_logprobs([TokenLogprob(p, -0.5, ()) for p in pieces])
    text = b"".join(pieces).decode()
    assert lp.text_offset == [0, 3, 3, 4, 6]
    assert text[lp.text_offset[3]:].startswith(" x") and text[lp.text_offset[4]:] == "é"
    assert completion_logprobs([TokenLogprob(b"ab", -0.5, ())], start=7).text_offset == [7]
