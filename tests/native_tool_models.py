"""SmolLM2 copies with tool-call tokens of their own, and chat templates in the forms of the model
families whose tool-call formats api/native_tools.py reads.

Qwen 2.5/3/3.5 and Hermes models have `<tool_call>` as one user-defined token of their vocabulary;
Mistral's have `[TOOL_CALLS]`, `[ARGS]` and `[CALL_ID]` as control tokens, Gemma 4's
`<|tool_call>`, `<tool_call|>`, `<|"|>` and its thought channel's `<|channel>` and `<channel|>`, LFM2's
`<|tool_call_start|>` and `<|tool_call_end|>`. No such model is installable here, so a copy of
SmolLM2 gets those tokens in place of unused ones (`<repo_name>`, `<filename>`, `<gh_stars>`,
`<issue_start>`, ...: tests/retokened_smollm2.py) and the server is given the templates below (`models[].chat_template`),
written here in each family's form: the ways they list tools, render calls and results, and
check ids. Llama 3.x's format needs no token of its own. The model was never trained on any of
them: the tests check the formats, which the grammars guarantee, and the prompts, not judgement.
"""

from __future__ import annotations

from pathlib import Path

from retokened_smollm2 import CONTROL, USER_DEFINED, retokened_smollm2

TOOL_CALL_TOKEN = 3
MISTRAL_TOKENS = {8: "[TOOL_CALLS]", 7: "[ARGS]", 6: "[CALL_ID]"}
GEMMA4_TOKENS = {9: "<|tool_call>", 10: "<tool_call|>", 11: '<|"|>', 12: "<|channel>", 13: "<channel|>"}
FUNCTIONGEMMA_TOKENS = {9: "<start_function_call>", 10: "<end_function_call>", 11: "<escape>"}
LFM2_TOKENS = {9: "<|tool_call_start|>", 10: "<|tool_call_end|>"}
GRANITE_TOKENS = {9: "<|tool_call|>"}
NEMOTRON_TOKENS = {9: "<TOOLCALL>", 10: "</TOOLCALL>"}
GIGACHAT_TOKENS = {9: "<|function_call|>", 10: "<|role_sep|>", 11: "<|message_sep|>"}
SEED_OSS_TOKENS = {9: "<seed:tool_call>", 10: "</seed:tool_call>", 11: "<seed:think>", 12: "</seed:think>"}
MINIMAX_TOKENS = {9: "<minimax:tool_call>", 10: "</minimax:tool_call>"}
KIMI_TOKENS = {9: "<|tool_calls_section_begin|>", 10: "<|tool_calls_section_end|>", 11: "<|tool_call_begin|>",
               12: "<|tool_call_argument_begin|>", 13: "<|tool_call_end|>"}
APERTUS_TOKENS = {9: "<|tools_prefix|>", 10: "<|tools_suffix|>", 11: "<|inner_prefix|>", 12: "<|inner_suffix|>"}
LLAMA3_TOKENS = {9: "<|python_tag|>"}  # Llama 3.x writes it before a call in its ipython environment
COMMAND_R_TOKENS = {9: "<|START_ACTION|>", 10: "<|END_ACTION|>", 11: "<|START_THINKING|>", 12: "<|END_THINKING|>",
                    13: "<|START_RESPONSE|>", 14: "<|END_RESPONSE|>"}

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


# GLM 4.5/4.6's form (GLM-4.7 writes the same without the newlines), in ChatML's turns.
GLM_TEMPLATE = """\
{%- if tools %}<|im_start|>system
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
...
</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>observation
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for tc in m.tool_calls %}{% if tc.function %}{% set tc = tc.function %}{% endif %}<tool_call>{{ tc.name }}
{% for k, v in tc.arguments.items() %}<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


# MiniCPM 5's form (its template's shape, shortened): the tools listed in the system message with
# its usage guidelines, each call an XML element after the content, a string with `<`, `&` or a
# newline in a CDATA block, results in the user's turn. Its tags are text, not tokens.
MINICPM5_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}</tools>

Tool usage guidelines:
- When calling a function, return an XML object within <function ... </function> using:
<function name="function-name"><param name="param-name">param-value</param></function>
- If param-value contains <, & or newline characters, wrap it in a CDATA block.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content or '' }}
{%- for c in m.tool_calls or [] %}{% if c.function %}{% set c = c.function %}{% endif %}
{%- if (loop.first and m.content) or not loop.first %}
{% endif %}<function name="{{ c.name }}">
{%- for k, v in c.arguments.items() %}<param name="{{ k }}">
{%- if v is string and ('<' in v or '&' in v or '\n' in v) %}<![CDATA[{{ v }}]]>{% else %}{{ v }}{% endif %}</param>
{%- endfor %}</function>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


# Apertus' form (its template's shape, shortened): tools in the developer message, each call an
# object keyed by the function's name in a list between its tags, the results in a list right
# after them in the same assistant turn.
APERTUS_TEMPLATE = """\
{{- bos_token }}<|system_start|>{{ messages[0].content if messages[0].role == 'system' else 'You are Apertus.' }}<|system_end|>
{%- set loop_messages = messages[1:] if messages[0].role == 'system' else messages -%}
<|developer_start|>Deliberation: {{ 'enabled' if enable_thinking else 'disabled' }}
{% if tools %}Tool Capabilities:
{% for tool in tools %}{{ tool.function | tojson }}
{% endfor %}{% else %}Tool Capabilities: disabled{% endif %}<|developer_end|>
{%- set ns = namespace(in_assistant=false, in_tool=false) -%}
{%- for m in loop_messages -%}
{%- if m.role == 'user' -%}
{%- if ns.in_tool %}]{% set ns.in_tool = false %}{% endif -%}
{%- if ns.in_assistant %}<|assistant_end|>{% set ns.in_assistant = false %}{% endif -%}
<|user_start|>{{ m.content }}<|user_end|>
{%- elif m.role == 'assistant' -%}
{%- if not ns.in_assistant %}<|assistant_start|>{% set ns.in_assistant = true %}{% endif -%}
{%- if m.content is not none %}{% if ns.in_tool %}]{% set ns.in_tool = false %}{% endif %}{{ m.content }}{% endif -%}
{%- if m.tool_calls %}<|tools_prefix|>[
{%- for c in m.tool_calls %}{{ '{"' + c.function.name + '": ' + c.function.arguments | tojson + '}' }}
{%- if not loop.last %}, {% endif %}{% endfor %}]<|tools_suffix|>{% endif -%}
{%- elif m.role == 'tool' -%}
{%- if not ns.in_assistant %}{{ raise_exception('Tool message outside of assistant') }}{% endif -%}
{%- if not ns.in_tool %}[{% set ns.in_tool = true %}{% else %}, {% endif %}{{ m.content }}
{%- endif -%}
{%- endfor -%}
{%- if ns.in_tool %}]{% endif -%}
{%- if add_generation_prompt %}<|assistant_start|>{% endif -%}"""


# GigaChat 3.1's form (its template's shape, shortened): roles by name, tools as JSON in a
# `function descriptions` message, one call after the content, its result as `function result`.
GIGACHAT_TEMPLATE = """\
{{- bos_token -}}
{%- if tools %}function descriptions<|role_sep|>
{% for tool in tools %}{{ tool.function | tojson }}
{% endfor %}<|message_sep|>

{% endif -%}
{%- for m in messages -%}
{{- ('function result' if m.role == 'tool' else m.role) + '<|role_sep|>\n' + (m.content or '') -}}
{%- if m.tool_calls %}{% set c = m.tool_calls[0].function %}<|function_call|>{{ '{"name": "' + c.name + '", "arguments": ' + c.arguments | tojson + '}' }}{% endif -%}
<|message_sep|>

{% if loop.last and add_generation_prompt and m.role != 'assistant' %}assistant<|role_sep|>
{% endif -%}
{%- endfor -%}"""


# Apriel 1.6's form (its template's shape, shortened): tools and the call format in the system
# message, a JSON list of calls between `<tool_calls>` tags (text, not tokens), results as
# `<|begin_tool_result|>`, and the answer's reasoning opened by the prompt.
APRIEL_TEMPLATE = """\
{{- bos_token }}<|begin_system|>
Analyze each question carefully, present your reasoning step-by-step, then provide the final response after the marker [BEGIN FINAL RESPONSE].
{% if tools %}Here are the available tools:
<available_tools>
{% for tool in tools %}{{ tool | tojson }}{% endfor %}
</available_tools>.
Return all function calls as a list of JSON objects within <tool_calls></tool_calls> XML tags:
<tool_calls>[{"name": <function-name-1>, "arguments": <args-dict-1>}]</tool_calls>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}
<|begin_user|>
{{ m.content }}
{%- elif m.role == 'assistant' %}{{ '\n<|begin_assistant|>\n' }}
{%- if m.content %}{% if not loop.last and '[BEGIN FINAL RESPONSE]' in m.content %}{{ m.content.split('[BEGIN FINAL RESPONSE]')[-1] | trim }}{% else %}{{ m.content }}{% endif %}{% endif %}
{%- if m.tool_calls %}{{ '\n<tool_calls>[' }}
{%- for c in m.tool_calls %}{{ '{"name": "' + c.function.name + '", "arguments": ' + c.function.arguments | tojson + ', "id": "' + c.id + '"}' }}{% if not loop.last %}, {% endif %}{% endfor %}]</tool_calls>
{%- endif %}
{%- if not loop.last %}{{ '\n<|end|>\n' }}{% endif %}
{%- elif m.role == 'tool' %}<|begin_tool_result|>
{{ m.content }}
{% endif %}
{%- if loop.last and add_generation_prompt and m.role != 'assistant' %}
<|begin_assistant|>
Here are my reasoning steps:
{% endif %}
{%- endfor %}"""


# Seed-OSS's form (its template's shape, shortened): each call in its tags with Qwen3-Coder's
# body, a value right after its parameter's tag, results as `tool` turns; a `thinking_budget`
# told to the model in a system turn.
SEED_OSS_TEMPLATE = """\
{%- if tools %}<seed:bos>system
You can call functions:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}工具调用请遵循如下格式:
<seed:tool_call>
<function=example_function_name>
<parameter=example_parameter_1>value_1</parameter>
</function>
</seed:tool_call>
<seed:eos>{% endif %}
{%- if thinking_budget is defined and thinking_budget == 0 %}<seed:bos>system
Your thinking budget is 0: answer without thinking.<seed:eos>
{%- elif thinking_budget is defined and thinking_budget > 0 %}<seed:bos>system
Your thinking budget is {{ thinking_budget }} tokens.<seed:eos>{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<seed:bos>assistant
{%- if m.content %}{{ '\n' + m.content | trim + '\n' }}{% endif %}
{%- for c in m.tool_calls %}{% set c = c.function %}{{ '\n<seed:tool_call>\n<function=' + c.name + '>\n' }}
{%- for k, v in c.arguments | items %}{{ '<parameter=' + k + '>' }}{{ (v if v is string else v | string) + '</parameter>\n' }}{% endfor -%}
{{ '</function>\n</seed:tool_call>' }}{% endfor %}<seed:eos>
{%- else %}<seed:bos>{{ m.role }}
{{ m.content }}<seed:eos>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<seed:bos>assistant
{% endif %}"""


# MiniMax M2's form (its template, shortened): tools as JSON in <tool> elements, an example call,
# all of a message's calls in one block, each an <invoke> whose string values are raw text and
# other values JSON; results in a tool turn; the answer's think block opened by the prompt.
MINIMAX_TEMPLATE = """\
]~!b[]~b]system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}
{%- if tools %}

# Tools
The tools, in JSONSchema format:
<tools>
{% for tool in tools %}<tool>{{ tool.function | tojson }}</tool>
{% endfor %}</tools>

Call them in XML:
<minimax:tool_call>
<invoke name="tool-name">
<parameter name="key">value</parameter>
</invoke>
</minimax:tool_call>
{%- endif %}[e~[
{% for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'assistant' %}]~b]ai
{{ m.content or '' }}
{%- if m.tool_calls %}{{ '\\n<minimax:tool_call>\\n' }}
{%- for c in m.tool_calls %}{{ '<invoke name="' + c.function.name + '">\\n' }}
{%- for k, v in c.function.arguments | items %}{{ '<parameter name="' + k + '">' }}{{ v if v is string else v | tojson }}{{ '</parameter>\\n' }}
{%- endfor %}{{ '</invoke>\\n' }}
{%- endfor %}{{ '</minimax:tool_call>' }}
{%- endif %}[e~[
{% elif m.role == 'tool' %}]~b]tool
<response>{{ m.content }}</response>[e~[
{% else %}]~b]{{ m.role }}
{{ m.content }}[e~[
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}]~b]ai
<think>
{% endif %}"""

# Kimi K2's form (its template, its roles as text here): tools declared as JSON, each call's id
# `functions.name:index` between its tags, a result headed by its call's id.
KIMI_TEMPLATE = """\
{%- if tools -%}
<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and messages[0]['role'] != 'system' -%}
<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>
{%- endif -%}
{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>
{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>
{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>
{%- elif message['role'] == 'tool' -%}<|im_system|>tool<|im_middle|>
{%- endif -%}
{%- if message['role'] == 'assistant' and message.get('tool_calls') -%}
{%- if message['content'] -%}{{ message['content'] }}{%- endif -%}
<|tool_calls_section_begin|>
{%- for tool_call in message['tool_calls'] -%}
{%- set formatted_id = 'functions.' + tool_call['function']['name'] + ':' + loop.index0|string -%}
<|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>{{ tool_call['function']['arguments'] | tojson }}<|tool_call_end|>
{%- endfor -%}
<|tool_calls_section_end|>
{%- elif message['role'] == 'tool' -%}
## Return of {{ message.tool_call_id }}\\n{{ message['content'] }}
{%- else -%}{{ message['content'] }}
{%- endif -%}
<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"""


# llama.cpp's template for DeepSeek R1 and its distills (models/templates/llama-cpp-deepseek-r1.jinja,
# shortened): the tools listed as JSON with an example call, each call's arguments a fenced JSON
# block after its name, the results as tool outputs; the answer's think block opened by the prompt.
DEEPSEEK_R1_TEMPLATE = """\
{%- set ns = namespace(is_first=false, is_tool_outputs=false, is_output_first=true) -%}
{{ bos_token }}
{%- if tools %}
You can call any of the following function tools to satisfy the user's requests: {{ tools | map(attribute='function') | tojson }}

Example function tool call syntax:

<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>example_function_name
```json
{"arg1": "some_value"}
```
<｜tool▁call▁end｜><｜tool▁calls▁end｜>

{% endif -%}
{%- for message in messages -%}
{%- if message['role'] != 'tool' and ns.is_tool_outputs -%}{{ '<｜tool▁outputs▁end｜><｜end▁of▁sentence｜>' }}{% set ns.is_tool_outputs = false %}{% endif -%}
{%- if message['role'] == 'user' -%}{{ '<｜User｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}{% endif -%}
{%- if message['role'] == 'assistant' and not message['content'] -%}
{{- '<｜Assistant｜><｜tool▁calls▁begin｜>' -}}
{%- for tc in message['tool_calls'] -%}
{%- if not loop.first %}{{ '\n' }}{% endif -%}
{{- '<｜tool▁call▁begin｜>' + tc['type'] + '<｜tool▁sep｜>' + tc['function']['name'] + '\n```json\n' + tc['function']['arguments'] | tojson + '\n```<｜tool▁call▁end｜>' -}}
{%- endfor -%}
{{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' -}}
{%- elif message['role'] == 'assistant' -%}{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}
{%- endif -%}
{%- if message['role'] == 'tool' -%}
{%- set ns.is_tool_outputs = true -%}
{%- if ns.is_output_first %}{{ '<｜tool▁outputs▁begin｜>' }}{% set ns.is_output_first = false %}{% endif -%}
{{- '\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' -}}
{%- endif -%}
{%- endfor -%}
{%- if ns.is_tool_outputs %}{{ '<｜tool▁outputs▁end｜><｜end▁of▁sentence｜>' }}{% endif -%}
{%- if add_generation_prompt and not ns.is_tool_outputs -%}{{ '<｜Assistant｜><think>\n' }}{%- endif -%}"""


# LFM2's (Liquid AI) form, as its template is: the tools listed in the system message, every turn
# its content only (a call is written into the assistant's content in Python's notation).
LFM2_TEMPLATE = """\
{{- bos_token -}}
{%- set ns = namespace(system_prompt="") -%}
{%- if messages[0]["role"] == "system" -%}
	{%- set ns.system_prompt = messages[0]["content"] -%}
	{%- set messages = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
	{%- set ns.system_prompt = ns.system_prompt + ("\n" if ns.system_prompt else "") + "List of tools: <|tool_list_start|>[" -%}
	{%- for tool in tools -%}
		{%- if tool is not string -%}{%- set tool = tool | tojson -%}{%- endif -%}
		{%- set ns.system_prompt = ns.system_prompt + tool -%}
		{%- if not loop.last -%}{%- set ns.system_prompt = ns.system_prompt + ", " -%}{%- endif -%}
	{%- endfor -%}
	{%- set ns.system_prompt = ns.system_prompt + "]<|tool_list_end|>" -%}
{%- endif -%}
{%- if ns.system_prompt -%}
	{{- "<|im_start|>system\n" + ns.system_prompt + "<|im_end|>\n" -}}
{%- endif -%}
{%- for message in messages -%}
	{{- "<|im_start|>" + message["role"] + "\n" -}}
	{%- set content = message["content"] -%}
	{%- if content is not string -%}{%- set content = content | tojson -%}{%- endif -%}
	{%- if message["role"] == "tool" -%}
		{%- set content = "<|tool_response_start|>" + content + "<|tool_response_end|>" -%}
	{%- endif -%}
	{{- content + "<|im_end|>\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
	{{- "<|im_start|>assistant\n" -}}
{%- endif -%}"""


# gpt-oss's harmony form (its template's shape, shortened): tools as TypeScript in a developer
# message, a call in the commentary channel ending in <|call|>, its result from `functions.name`.
GPT_OSS_TEMPLATE = """\
{%- set ns = namespace(last="") -%}
<|start|>system<|message|>Reasoning: {{ reasoning_effort | default("medium") }}

# Valid channels: analysis, commentary, final.{% if tools %}
Calls to these tools must go to the commentary channel: 'functions'.{% endif %}<|end|>
{%- if tools %}<|start|>developer<|message|># Tools

namespace functions {
{% for t in tools %}
// {{ t.function.description }}
type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{% endfor %}
} // namespace functions<|end|>{% endif %}
{%- for m in messages %}
{%- if m.role == "assistant" and m.tool_calls %}{% set tc = m.tool_calls[0].function %}{% set ns.last = tc.name -%}
<|start|>assistant to=functions.{{ tc.name }}<|channel|>commentary json<|message|>{{ tc.arguments | tojson }}<|call|>
{%- elif m.role == "assistant" %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == "tool" %}<|start|>functions.{{ ns.last }} to=assistant<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}
{#- earlier thinking: <|start|>assistant<|channel|>analysis<|message|>...<|end|> #}"""


# Granite 3.x's form (IBM): the tools listed in their own turn, every message its content only (a
# call is written into the assistant's content as <|tool_call|> and a JSON list).
GRANITE_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You are a helpful assistant with access to the following tools. When a tool is required to answer \
the user's query, respond only with <|tool_call|> followed by a JSON list of tools used.<|im_end|>
<|im_start|>available_tools
{{ tools | tojson(indent=4) }}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


# Nemotron Nano 2's form (NVIDIA): the tools in the system turn, calls as a JSON list between its tags.
NEMOTRON_TEMPLATE = """\
{%- if tools %}<|im_start|>system
<AVAILABLE_TOOLS>[{% for t in tools %}{{ t | tojson }}{{ ", " if not loop.last }}{% endfor %}]</AVAILABLE_TOOLS>

If you decide to call any tool(s), use the following format:
<TOOLCALL>[{"name": "tool_name1", "arguments": "tool_args1"}]</TOOLCALL><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
<TOOLCALL>[{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\
{{ ", " if not loop.last }}{% endfor %}]</TOOLCALL><|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<TOOL_RESPONSE>[{{ m.content }}]</TOOL_RESPONSE><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


# Command R7B's form (Cohere): a plan in <|START_THINKING|>, calls as a JSON list of numbered
# {tool_call_id, tool_name, parameters} in <|START_ACTION|>, an answer in <|START_RESPONSE|>.
COMMAND_R_TEMPLATE = """\
{%- set ns = namespace(idx=0) -%}
{%- if tools %}<|im_start|>system
## Available Tools
```json
[{% for t in tools %}{{ t | tojson }}{{ ", " if not loop.last }}{% endfor %}]
```
0. Start by writing <|START_THINKING|> followed by a plan. When you finish, close it out with <|END_THINKING|>.
1. Action: write <|START_ACTION|> followed by a list of JSON-formatted tool calls, with each one containing \
"tool_name" and "parameters" fields. When you finish, close it out with <|END_ACTION|>.
4. Response: write <|START_RESPONSE|> followed by the answer, closed with <|END_RESPONSE|>.<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
<|START_THINKING|>{{ m.reasoning_content }}<|END_THINKING|><|START_ACTION|>[
{%- for tc in m.tool_calls %}
    {"tool_call_id": "{{ ns.idx }}", "tool_name": "{{ tc['function']['name'] }}", "parameters": \
{{ tc['function']['arguments'] | tojson }}}{% if not loop.last %},{% endif %}{% set ns.idx = ns.idx + 1 %}
{%- endfor %}
]<|END_ACTION|><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
<|START_RESPONSE|>{{ m.content }}<|END_RESPONSE|><|im_end|>
{% elif m.role == 'tool' %}<|im_start|>system
<|START_TOOL_RESULT|>[{"tool_call_id": "{{ m.tool_call_id }}", "results": {"0": {{ m.content | tojson }}}}]\
<|END_TOOL_RESULT|><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


QWEN3_CODER_TEMPLATE = """\
{%- if tools %}<|im_start|>system
# Tools

You have access to the following functions:

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

If you choose to call a function ONLY reply in the following format with NO suffix:

<tool_call>
<function=example_function_name>
<parameter=example_parameter_1>
value_1
</parameter>
</function>
</tool_call>
{%- if messages[0].role == 'system' %}

{{ messages[0].content }}{% endif %}<|im_end|>
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
<function={{ c.function.name }}>
{% for name, value in c.function.arguments | items %}<parameter={{ name }}>
{{ value | tojson if value is mapping or (value is sequence and value is not string) else value | string }}
</parameter>
{% endfor %}</function>
</tool_call>{% if not loop.last %}
{% endif %}{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking %}<think>
{% elif enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""

MISTRAL_TEMPLATE = """\
{%- if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set loop_messages = messages[1:] %}
{%- else %}{% set loop_messages = messages %}{% endif %}
{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}
{{- bos_token }}
{%- for m in loop_messages %}
{%- if m.role == 'user' %}
{%- if tools and m == user_messages[-1] %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- if loop.last and system is defined %}[INST]{{ system }}\n\n{{ m.content }}[/INST]
{%- else %}[INST]{{ m.content }}[/INST]{% endif %}
{%- elif m.tool_calls is defined and m.tool_calls %}[TOOL_CALLS][
{%- for c in m.tool_calls %}
{%- if c.id is not defined or c.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}
{%- set out = c.function | tojson %}{{ out[:-1] }}, "id": "{{ c.id }}"}{{ ', ' if not loop.last else ']' }}
{%- endfor %}{{ eos_token }}
{%- elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}
{%- elif m.role == 'tool' %}
{%- if m.tool_call_id is not defined or m.tool_call_id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}
[TOOL_RESULTS]{"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}"""

MISTRAL_ARGS_TEMPLATE = """\
{{- bos_token }}
{%- if messages[0].role == 'system' %}[SYSTEM_PROMPT]{{ messages[0].content }}[/SYSTEM_PROMPT]{% set loop_messages = messages[1:] %}
{%- else %}{% set loop_messages = messages %}{% endif %}
{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for m in loop_messages %}
{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' %}{{ m.content or '' }}
{%- for c in m.tool_calls or [] %}[TOOL_CALLS]{{ c.function.name }}
{%- if c.id is not defined or c.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}
[CALL_ID]{{ c.id }}[ARGS]{{ c.function.arguments | tojson }}
{%- endfor %}{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.tool_call_id }}[TOOL_CONTENT]{{ m.content }}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}"""

LLAMA3_TEMPLATE = """\
{{- bos_token }}<|start_header_id|>system<|end_header_id|>

{% if tools %}Environment: ipython
{% endif %}Cutting Knowledge Date: December 2023

{% if messages[0].role == 'system' %}{{ messages[0].content }}{% set messages = messages[1:] %}{% endif %}<|eot_id|>
{%- if tools %}
{%- if not messages %}{{ raise_exception("Cannot put tools in the first user message when there's no first user message!") }}{% endif %}
<|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{% for t in tools %}{{ t | tojson(indent=4) }}

{% endfor %}{{ messages[0].content }}<|eot_id|>{% set messages = messages[1:] %}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- elif m.tool_calls is defined and m.tool_calls %}
{%- if m.tool_calls | length != 1 %}{{ raise_exception('This model only supports single tool-calls at once!') }}{% endif %}
<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ m.tool_calls[0].function.name }}", "parameters": {{ m.tool_calls[0].function.arguments | tojson }}}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""


GEMMA4_TEMPLATE = """\
{%- macro arg(v) -%}
{%- if v is string %}<|"|>{{ v }}<|"|>{% elif v is boolean %}{{ 'true' if v else 'false' }}
{%- elif v is mapping %}{ {%- for k, x in v | dictsort %}{{ k }}:{{ arg(x) }}{{ ',' if not loop.last }}{% endfor -%} }
{%- elif v is sequence %}[{% for x in v %}{{ arg(x) }}{{ ',' if not loop.last }}{% endfor %}]
{%- else %}{{ v }}{% endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set loop_messages = messages -%}
{%- if tools or messages[0].role == 'system' -%}<|turn>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% set loop_messages = messages[1:] %}{% endif -%}
{%- for t in tools or [] %}<|tool>declaration:{{ t.function.name }}{description:<|"|>{{ t.function.description }}<|"|>,parameters:{{ t.function.parameters | tojson }}}<tool|>{% endfor -%}
<turn|>
{% endif -%}
{%- set ns = namespace(prev=None) -%}
{%- for m in loop_messages -%}
{%- if m.role != 'tool' -%}
{%- set ns.prev = None -%}
<|turn>{{ 'model' if m.role == 'assistant' else m.role }}
{% for c in m.tool_calls or [] %}<|tool_call>call:{{ c.function.name }}{{ arg(c.function.arguments) }}<tool_call|>{% set ns.prev = 'call' %}{% endfor -%}
{%- if m.tool_calls -%}
{%- for k in range(loop.index0 + 1, loop_messages | length) -%}
{%- if loop_messages[k].role == 'tool' and ns.prev != 'stop' -%}
{%- set name = namespace(v='unknown') -%}
{%- for c in m.tool_calls %}{% if c.id == loop_messages[k].tool_call_id %}{% set name.v = c.function.name %}{% endif %}{% endfor -%}
<|tool_response>response:{{ name.v }}{value:<|"|>{{ loop_messages[k].content }}<|"|>}<tool_response|>{% set ns.prev = 'response' %}
{%- else %}{% set ns.prev = 'stop' if ns.prev == 'response' else ns.prev %}{% endif -%}
{%- endfor -%}
{%- endif -%}
{{ m.content or '' }}{% if not m.tool_calls %}<turn|>
{% endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.prev not in ('response', 'stop') %}<|turn>model
{% if not enable_thinking %}<|channel>thought
<channel|>{% endif %}{% endif -%}"""


# FunctionGemma's turns as its documentation describes them: declarations in the developer turn,
# calls and responses in the model's, strings between <escape> marks.
FUNCTIONGEMMA_TEMPLATE = """\
{%- macro arg(v) -%}
{%- if v is string %}<escape>{{ v }}<escape>{% elif v is boolean %}{{ 'true' if v else 'false' }}
{%- elif v is mapping %}{ {%- for k, x in v | dictsort %}{{ k }}:{{ arg(x) }}{{ ',' if not loop.last }}{% endfor -%} }
{%- elif v is sequence %}[{% for x in v %}{{ arg(x) }}{{ ',' if not loop.last }}{% endfor %}]
{%- else %}{{ v }}{% endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set loop_messages = messages -%}
{%- if tools or messages[0].role == 'system' -%}<start_of_turn>developer
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% set loop_messages = messages[1:] %}{% endif -%}
{%- for t in tools or [] %}<start_function_declaration>declaration:{{ t.function.name }}{description:<escape>{{ t.function.description }}<escape>,parameters:{{ t.function.parameters | tojson }}}<end_function_declaration>{% endfor -%}
<end_of_turn>
{% endif -%}
{%- for m in loop_messages -%}
{%- if m.role == 'tool' -%}
<start_function_response>response:{{ m.name or 'tool' }}{value:<escape>{{ m.content }}<escape>}<end_function_response>
{%- else -%}
<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}
{% for c in m.tool_calls or [] %}<start_function_call>call:{{ c.function.name }}{{ arg(c.function.arguments) }}<end_function_call>{% endfor -%}
{{ m.content or '' }}{% if not m.tool_calls %}<end_of_turn>
{% endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and loop_messages[-1].role != 'tool' %}<start_of_turn>model
{% endif -%}"""


def write_hermes_smollm2(dst: Path) -> Path:
    return retokened_smollm2(dst, {TOOL_CALL_TOKEN: "<tool_call>"}, USER_DEFINED)


def write_control_smollm2(dst: Path, tokens: dict[int, str]) -> Path:
    """A SmolLM2 copy whose `tokens` are control tokens, as Mistral's, Gemma's, gpt-oss's, LFM2's,
    Granite's, Nemotron's, Command R's, Apertus', GigaChat's, Seed-OSS's and Kimi's tags are in their vocabularies."""
    return retokened_smollm2(dst, tokens, CONTROL)
