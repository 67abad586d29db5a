"""SmolLM2 with a tool-call tag of its own, for the Hermes tool-call format (api/native_tools.py).

Qwen 2.5/3 and Hermes models have `<tool_call>` as one user-defined token of their vocabulary and
a chat template that lists tools and renders calls and results. No such model is installable
here, so a copy of SmolLM2 gets the token in place of an unused one (`<repo_name>`, id 3: the same
length, so the file is edited in place, weights untouched) and the server is given the template
below (`models[].chat_template`), written here in that family's form. The model was never trained
on it: the tests check the format, which the grammar guarantees, and the prompt, not judgement.
"""

from __future__ import annotations

import struct
from pathlib import Path

from conftest import SMOLLM2

TOOL_CALL_TOKEN = 3
USER_DEFINED = 4  # llama.cpp's LLAMA_TOKEN_TYPE_USER_DEFINED: written out in the answer's text

HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You can call functions. Their signatures are inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each call, answer a JSON object with the function's name and arguments inside <tool_call></tool_call>:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% if m.content %}{{ m.content }}
{% endif %}
{%- for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def write_hermes_smollm2(dst: Path) -> Path:
    data = bytearray(SMOLLM2.read_bytes())
    old = struct.pack("<Q", 11) + b"<repo_name>"
    at = data.find(old)
    assert at > 0 and data.find(old, at + 1) < 0, "SmolLM2's vocabulary is not the one expected"
    data[at + 8 : at + 19] = b"<tool_call>"
    key = b"tokenizer.ggml.token_type"
    k = data.find(struct.pack("<Q", len(key)) + key)
    assert k > 0
    items = k + 8 + len(key) + 4 + 4 + 8  # value type (array), item type (int32), count
    assert struct.unpack_from("<i", data, items + 4 * TOOL_CALL_TOKEN)[0] == 3  # control
    struct.pack_into("<i", data, items + 4 * TOOL_CALL_TOKEN, USER_DEFINED)
    dst.write_bytes(data)
    return dst
