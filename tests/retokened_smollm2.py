"""A copy of SmolLM2 whose unused special tokens read as another model family's (tool-call tags,
fill-in-the-middle tokens), for the formats no installable model has. The weights are untouched;
token texts may change length, and `general.name` (then `general.finetune` and
`general.organization`) takes up the difference, so the header keeps its size and the tensor
data its offset."""

from __future__ import annotations

import struct
from pathlib import Path

from conftest import SMOLLM2

# Header strings that take up a change in the token texts' length, in this order.
_ABSORBING = (b"general.name", b"general.finetune", b"general.organization")
USER_DEFINED = 4  # llama.cpp's LLAMA_TOKEN_TYPE_USER_DEFINED: written out in the answer's text
CONTROL = 3


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def retokened_smollm2(dst: Path, tokens: dict[int, str], token_type: int) -> Path:
    """A copy of SmolLM2 whose special tokens `tokens` (id: new text) read as given, with that
    token type. Their texts may change length: general strings take up the difference, so the
    header keeps its size and the tensor data its offset."""
    data = bytearray(SMOLLM2.read_bytes())
    key = b"tokenizer.ggml.tokens"
    at = data.find(struct.pack("<Q", len(key)) + key)
    assert at > 0, "SmolLM2 has no token list"
    pos = at + 8 + len(key) + 4 + 4 + 8  # value type (array), item type (string), count
    spans = []
    for i in range(max(tokens) + 1):
        n = struct.unpack_from("<Q", data, pos)[0]
        spans.append((pos, pos + 8 + n))
        pos += 8 + n
    delta = 0
    for i in sorted(tokens, reverse=True):  # from the end, so earlier spans keep their offsets
        start, end = spans[i]
        assert data[start + 8:end].startswith(b"<"), "SmolLM2's vocabulary is not the one expected"
        new = _string(tokens[i])
        delta += len(new) - (end - start)
        data[start:end] = new
    for key in _ABSORBING:  # the difference taken up by these strings, each kept one byte at least
        k = data.find(struct.pack("<Q", len(key)) + key)
        assert 0 < k < at, f"{key.decode()} is not before the token list"
        start = k + 8 + len(key) + 4
        n = struct.unpack_from("<Q", data, start)[0]
        take = delta if delta < 0 else min(delta, n - 1)  # longer tokens: shorter strings; shorter: padded
        text = (bytes(data[start + 8:start + 8 + n]) + b" " * max(0, -take))[:n - take]
        data[start:start + 8 + n] = struct.pack("<Q", len(text)) + text
        delta -= take
        if delta == 0:
            break
    assert delta == 0, "the new token texts are too long for the header to take up"
    key = b"tokenizer.ggml.token_type"
    k = data.find(struct.pack("<Q", len(key)) + key)
    assert k > 0
    items = k + 8 + len(key) + 4 + 4 + 8  # value type (array), item type (int32), count
    for i in tokens:
        assert struct.unpack_from("<i", data, items + 4 * i)[0] == CONTROL
        struct.pack_into("<i", data, items + 4 * i, token_type)
    assert len(data) == SMOLLM2.stat().st_size
    dst.write_bytes(data)
    return dst
