"""Tool calls in a model's own format, where its chat template has one this server reads.

The template lists the tools itself (its `tools` variable) and renders calls and results; the
answer is held by a grammar to the format (api/native_grammars.py) and read back into OpenAI's
`tool_calls` (api/native_answers.py). The formats:

- hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block a call, after
  text of its own or none (Qwen 2.5 and 3, Hermes 2 Pro and 3, many fine-tunes of them);
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral 7B v0.3, Nemo,
  Ministral 8B), `[TOOL_CALLS]` a control token;
- mistral-args: `[TOOL_CALLS]name[ARGS]{...}` for each call (Devstral, Magistral, Ministral 3;
  Mistral Small 3.2 may put `[CALL_ID]id` before `[ARGS]`), all three control tokens;
- qwen3-coder: `<tool_call>\n<function=name>\n<parameter=p>\nvalue\n</parameter>\n...</function>\n</tool_call>`,
  a string parameter's value as raw text, others as JSON (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano);
- seed-oss: `<seed:tool_call>\n<function=name>\n<parameter=p>value</parameter>\n...</function>\n</seed:tool_call>`,
  values as qwen3-coder's but not framed by newlines (Seed-OSS), after its `<seed:think>` block
  (its reasoning, engine/reasoning.py);
- glm: `<tool_call>name<arg_key>p</arg_key><arg_value>value</arg_value>...</tool_call>`, with or
  without a newline after the name and each tag (GLM 4.5 to 4.7, Ling 3, Laguna, Spark 2.5), values
  as qwen3-coder's; its tags are written out where they are tokens;
- gemma4: `<|tool_call>call:name{key:value,...}<tool_call|>` for each call, in Gemma's own
  notation (engine/gemma_notation.py: strings between `<|"|>` marks, bare keys in sorted order),
  the tags tokens of their own (the mark may be text); functiongemma (FunctionGemma, Gemma 3
  270M tuned for calls): the same notation between `<start_function_call>` and
  `<end_function_call>`, strings between `<escape>` marks;
- lfm2: `<|tool_call_start|>[name(key=value, ...), ...]<|tool_call_end|>`, Python's keyword calls
  of literal values (LFM2, LFM2.5; api/pythonic_calls.py), whose templates render only content:
  calls in the history are written into the assistant's content;
- harmony: gpt-oss's `<|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}`
  after its analysis channel (the reasoning, engine/reasoning.py), one call a message; its grammar
  holds the whole answer (analysis, then the call or, under `auto`, the final channel);
- granite: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]` (Granite 3.x), whose
  templates render only content, as LFM2's;
- nemotron: `<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>` (Nemotron Nano 2);
- apertus: `<|tools_prefix|>[{"name": {...}}, ...]<|tools_suffix|>`, each call an object whose
  one key is the function's name (Apertus), after its deliberation between `<|inner_prefix|>`
  and `<|inner_suffix|>` (its reasoning, engine/reasoning.py); results follow in the same turn;
- apriel: `<tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>` (Apriel 1.5 and
  1.6), after its reasoning steps (engine/reasoning.py); the tags are tokens or text;
- command-r: `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}, ...]<|END_ACTION|>`
  (Command R7B), after its plan in `<|START_THINKING|>` (its reasoning, engine/reasoning.py);
- minimax: `<minimax:tool_call>\n<invoke name="name">\n<parameter name="key">value</parameter>\n...</invoke>\n...</minimax:tool_call>`,
  all of an answer's calls in one block, values as seed-oss's (MiniMax M2), after its
  `<think>` block;
- minicpm5: `<function name="name"><param name="key">value</param>...</function>` for each call,
  a string's value as raw text or in a CDATA block (`<![CDATA[...]]>`, where it holds `<`, `&` or
  a newline), others as JSON (MiniCPM 5); the tag is text, not a token, and starts the grammar
  as text (grammar.Constraint);
- deepseek-r1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`
  (DeepSeek R1 and its distills with llama.cpp's template for them: their own list no tools), the
  tags tokens or text;
- gigachat: `<|function_call|>{"name": ..., "arguments": {...}}` after the content, one call a
  message (GigaChat 3.1);
- kimi-k2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>`
  (Kimi K2 and its kin), the `functions.name:0` its call's id, all five tags tokens;
- llama3: the whole answer is one call, `{"name": ..., "parameters": {...}}` (Llama 3.1, 3.2 and
  3.3, whose templates ask for exactly that), after `<|python_tag|>` where the vocabulary has it
  as a token (the models write it before a call in their ipython environment, which the
  templates set up when tools are given).

A template with `<tool_call>` tags around another body (MiniMax M3's `<invoke>`, ...) has no
format here.

Where the format opens with a token, that token starts the grammar (api/native_grammars.py): under `auto` the answer is
free until the model picks it (a lazy grammar, engine/grammar.py), under `required` or a named
function the answer begins with it. MiniCPM 5's tag, and the `<tool_call>`, Apriel and Seed-OSS
tags where a vocabulary spells them in several tokens (fine-tunes of other bases), start it as
text (`NativeFormat.trigger`). Control tokens are written out in the answer's text
(SamplingParams.shown_tokens) so that it can be read back. Llama 3.x's call needs no such token: under
`auto` its grammar lets the answer be a call (after its `<|python_tag|>` or not) or text that
begins with neither `{` nor, where that token exists, `<|`. Mistral's
templates want call ids of 9 letters and digits: the calls this server reads get such ids, and
other ids in the history are mapped to such ids (the same id always to the same one). A template
of another format that names a tag its vocabulary does not have as one token is served in EIE's
own format (api/tools.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
import uuid
from dataclasses import dataclass
from typing import Any

from ..engine.chat_template import ChatTemplate
from ..engine.native import Vocab
from . import pythonic_calls
from .schemas import ChatMessage, ChatRequest

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LFM2_OPEN, LFM2_CLOSE, LFM2_SIGN = pythonic_calls.LFM2_OPEN, pythonic_calls.LFM2_CLOSE, pythonic_calls.LFM2_SIGN
GRANITE_OPEN = "<|tool_call|>"  # Granite 3.x: a JSON list of calls after it
NEMOTRON_OPEN, NEMOTRON_CLOSE = "<TOOLCALL>", "</TOOLCALL>"  # Nemotron Nano 2: a JSON list between them
COMMAND_R_OPEN, COMMAND_R_CLOSE = "<|START_ACTION|>", "<|END_ACTION|>"  # Command R7B: the same, its own keys
# Kimi K2: a section of calls, each with its id and arguments between tags
KIMI_SECTION, KIMI_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_CALL, KIMI_ARGS, KIMI_CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
# DeepSeek R1/V3: calls between section tags, each a fenced JSON block after its name
DEEPSEEK_CALLS, DEEPSEEK_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DEEPSEEK_CALL, DEEPSEEK_SEP, DEEPSEEK_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DEEPSEEK_TAGS = (DEEPSEEK_CALLS, DEEPSEEK_CALLS_END, DEEPSEEK_CALL, DEEPSEEK_SEP, DEEPSEEK_CALL_END)
GIGACHAT_OPEN = "<|function_call|>"  # GigaChat 3.1: one call's JSON object after it
APRIEL_OPEN, APRIEL_CLOSE = "<tool_calls>", "</tool_calls>"  # Apriel: a JSON list between them
APERTUS_OPEN, APERTUS_CLOSE = "<|tools_prefix|>", "<|tools_suffix|>"  # Apertus: a list of {name: arguments}
# gpt-oss's harmony tokens (channel, message, start, end, constrain) and how its calls begin
HARMONY_TAGS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>")
HARMONY_CALL = "<|channel|>commentary to=functions."
MISTRAL_OPEN, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
XML_FUNCTION, XML_PARAMETER = "<function=", "<parameter="
GLM_KEY, GLM_KEY_CLOSE, GLM_VALUE, GLM_VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
SEED_OPEN, SEED_CLOSE = "<seed:tool_call>", "</seed:tool_call>"  # Seed-OSS: qwen3-coder's body in its own tags
# MiniCPM 5's calls, parameters, and a value's CDATA block
MINICPM_FUNCTION, MINICPM_FUNCTION_CLOSE = '<function name="', "</function>"
MINICPM_PARAM, MINICPM_PARAM_CLOSE = '<param name="', "</param>"
CDATA_OPEN, CDATA_CLOSE = "<![CDATA[", "]]>"
# MiniMax M2's block of calls, a call, and a parameter
MINIMAX_OPEN, MINIMAX_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
MINIMAX_INVOKE, MINIMAX_INVOKE_CLOSE = '<invoke name="', "</invoke>"
MINIMAX_PARAM, MINIMAX_PARAM_CLOSE = '<parameter name="', "</parameter>"


@dataclass(frozen=True)
class GemmaTags:
    open: str
    close: str
    mark: str  # around a string value
    sign: str  # what the template writes that says it is this format


GEMMA_TAGS = {"gemma4": GemmaTags("<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_call>call:"),
              "functiongemma": GemmaTags("<start_function_call>", "<end_function_call>", "<escape>",
                                         "<start_function_call>")}

# What Llama 3.1/3.2/3.3's templates tell the model, in their own words.
LLAMA3_SIGN = '"parameters": dictionary of argument name'
LLAMA3_PYTHON_TAG = "<|python_tag|>"  # what Llama 3.x may write before a call (a token of its own)
# A JSON object with "name" (or "arguments") inside the tags, as Hermes templates show the model
# (written in Jinja strings, so quotes and newlines may be escaped).
_HERMES_JSON = re.compile(r'<tool_call>(?:\s|\\n)*\{\{?\\?"(?:name|arguments)\\?"'
                          r'|\{\{?\\?"name\\?": <function-name>, \\?"arguments\\?"')
JSON_LISTS = ("mistral", "granite", "nemotron", "command-r", "apertus", "apriel")  # the formats whose calls are a JSON list
MISTRAL_ID = re.compile(r"^[a-zA-Z0-9]{9}$")
_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class NativeFormat:
    # hermes, qwen3-coder, seed-oss, minimax, glm, minicpm5, lfm2, granite, nemotron, command-r, apertus, apriel, mistral, mistral-args,
    # gemma4, functiongemma, kimi-k2, deepseek-r1, gigachat, llama3, harmony
    name: str
    open_token: int | None = None  # the token that opens the calls (None: llama3's answer is the call)
    args_token: int | None = None  # mistral-args: [ARGS]; kimi-k2: <|tool_call_argument_begin|>
    call_id_token: int | None = None  # mistral-args, where the template has [CALL_ID]
    close_token: int | None = None  # gemma4, functiongemma: a call's closing tag; lfm2, nemotron, command-r, apertus: the calls' one
    quote_token: int | None = None  # their string mark, where the vocabulary has it as one token
    # glm, seed-oss, minimax, deepseek-r1: its tags that are tokens; harmony: HARMONY_TAGS'; kimi-k2: a call's begin and end
    # (written out); llama3: <|python_tag|>, where it is a token
    tag_tokens: tuple[int, ...] = ()
    trigger_text: str | None = None  # the text that starts a lazy grammar, where no token does

    @property
    def trigger(self) -> int | str | None:
        """What starts the grammar under `auto` (a token, or a text; None: the grammar holds the
        whole answer)."""
        return self.open_token if self.open_token is not None else self.trigger_text

    @property
    def args_key(self) -> str:
        """The key of a call's arguments in its JSON object."""
        return "parameters" if self.name in ("llama3", "command-r") else "arguments"

    @property
    def name_key(self) -> str:
        """The key of a call's function name in its JSON object."""
        return "tool_name" if self.name == "command-r" else "name"

    @property
    def list_close(self) -> str | None:
        """The tag that closes a JSON list of calls (Nemotron's, Command R's, Apertus', Apriel's;
        None: none does)."""
        return {"nemotron": NEMOTRON_CLOSE, "command-r": COMMAND_R_CLOSE, "apertus": APERTUS_CLOSE,
                "apriel": APRIEL_CLOSE}.get(self.name)

    @property
    def parallel(self) -> bool:
        """Whether one answer may hold several calls (Llama 3.x's templates refuse them; gpt-oss's
        and GigaChat's take one a message)."""
        return self.name not in ("llama3", "harmony", "gigachat")

    @property
    def marker(self) -> str | None:
        """The text that opens the calls in the answer (None: the answer is the call)."""
        if self.tags is not None:
            return self.tags.open
        return {"hermes": HERMES_OPEN, "qwen3-coder": HERMES_OPEN, "glm": HERMES_OPEN, "lfm2": LFM2_OPEN,
                "harmony": HARMONY_CALL, "granite": GRANITE_OPEN, "nemotron": NEMOTRON_OPEN,
                "command-r": COMMAND_R_OPEN, "apertus": APERTUS_OPEN, "apriel": APRIEL_OPEN, "seed-oss": SEED_OPEN,
                "minimax": MINIMAX_OPEN,
                "kimi-k2": KIMI_SECTION, "deepseek-r1": DEEPSEEK_CALLS, "gigachat": GIGACHAT_OPEN, "mistral": MISTRAL_OPEN,
                "mistral-args": MISTRAL_OPEN, "minicpm5": MINICPM_FUNCTION}.get(self.name)

    @property
    def tags(self) -> GemmaTags | None:
        """A Gemma format's tags (None: not one)."""
        return GEMMA_TAGS.get(self.name)

    @property
    def shown_tokens(self) -> tuple[int, ...]:
        """The format's tokens, written out in the answer's text although they may be control tokens."""
        return tuple(t for t in (self.open_token, self.args_token, self.call_id_token, self.close_token,
                                 self.quote_token) if t is not None) + self.tag_tokens

    def new_id(self) -> str:
        if self.name.startswith("mistral"):
            return "".join(secrets.choice(_ALNUM) for _ in range(9))
        return f"call_{uuid.uuid4().hex[:24]}"


def _one_token(vocab: Vocab, text: str) -> int | None:
    ids = vocab.tokenize(text, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 else None


def _tokens(vocab: Vocab, tags: tuple[str, ...]) -> tuple[int, ...]:
    """The tokens of those `tags` the vocabulary has as one token each (the rest are text)."""
    return tuple(t for t in (_one_token(vocab, tag) for tag in tags) if t is not None)


def _opened_by(name: str, vocab: Vocab, tag: str, shown: tuple[int, ...]) -> NativeFormat:
    """A format whose calls open with `tag`: its token where the vocabulary has it as one, else
    the tag as text that starts the grammar (`shown`: its other tags that are tokens)."""
    token = _one_token(vocab, tag)
    if token is None:
        return NativeFormat(name, tag_tokens=shown, trigger_text=tag)
    return NativeFormat(name, token, tag_tokens=shown)


def detect(template_source: str, vocab: Vocab) -> NativeFormat | None:
    """The model's own tool-call format, when its template renders tools in one this server reads
    and its vocabulary has the format's tags as single tokens, or the format's opening tag may be
    text (MiniCPM 5's always; `<tool_call>`, Apriel's, Seed-OSS's, MiniMax's and DeepSeek's where it
    is no token)."""
    if "tools" not in template_source:
        return None
    if SEED_OPEN in template_source and SEED_CLOSE in template_source:
        return _opened_by("seed-oss", vocab, SEED_OPEN, _tokens(vocab, (SEED_CLOSE,)))
    if MINIMAX_OPEN in template_source and MINIMAX_INVOKE in template_source:
        return _opened_by("minimax", vocab, MINIMAX_OPEN, _tokens(vocab, (MINIMAX_CLOSE,)))
    if MINICPM_FUNCTION in template_source and MINICPM_PARAM in template_source:
        return NativeFormat("minicpm5", trigger_text=MINICPM_FUNCTION)
    if APRIEL_OPEN + "[" in template_source and APRIEL_CLOSE in template_source:
        token, close = _one_token(vocab, APRIEL_OPEN), _one_token(vocab, APRIEL_CLOSE)
        if token is None:
            return NativeFormat("apriel", trigger_text=APRIEL_OPEN)
        return NativeFormat("apriel", token, close_token=close)
    if HERMES_OPEN in template_source and HERMES_CLOSE in template_source:
        if XML_FUNCTION in template_source and XML_PARAMETER in template_source:
            name = "qwen3-coder"
        elif GLM_KEY in template_source and GLM_VALUE in template_source:
            name = "glm"
        elif _HERMES_JSON.search(template_source):
            name = "hermes"
        else:
            return None  # another body inside the tags
        # GLM's tags are written out where they are tokens; a fine-tune whose vocabulary spells
        # `<tool_call>` has it start the grammar as text
        glm_tags = (HERMES_CLOSE, GLM_KEY, GLM_KEY_CLOSE, GLM_VALUE, GLM_VALUE_CLOSE) if name == "glm" else ()
        return _opened_by(name, vocab, HERMES_OPEN, _tokens(vocab, glm_tags))
    if MISTRAL_OPEN in template_source:
        token = _one_token(vocab, MISTRAL_OPEN)
        if token is None:
            return None
        if MISTRAL_ARGS not in template_source:
            return NativeFormat("mistral", token)
        args = _one_token(vocab, MISTRAL_ARGS)
        call_id = _one_token(vocab, MISTRAL_CALL_ID) if MISTRAL_CALL_ID in template_source else None
        return NativeFormat("mistral-args", token, args, call_id) if args is not None else None
    for name, tags in GEMMA_TAGS.items():
        if tags.sign in template_source:
            open_token, close_token = _one_token(vocab, tags.open), _one_token(vocab, tags.close)
            if open_token is None or close_token is None:
                return None
            return NativeFormat(name, open_token, close_token=close_token, quote_token=_one_token(vocab, tags.mark))
    if "<|channel|>commentary" in template_source and "<|call|>" in template_source:  # gpt-oss
        tokens = tuple(_one_token(vocab, tag) for tag in HARMONY_TAGS)
        return NativeFormat("harmony", tag_tokens=tokens) if None not in tokens else None
    if COMMAND_R_OPEN in template_source and COMMAND_R_CLOSE in template_source:
        token, close = _one_token(vocab, COMMAND_R_OPEN), _one_token(vocab, COMMAND_R_CLOSE)
        return NativeFormat("command-r", token, close_token=close) if token is not None else None
    if APERTUS_OPEN in template_source and APERTUS_CLOSE in template_source:
        token, close = _one_token(vocab, APERTUS_OPEN), _one_token(vocab, APERTUS_CLOSE)
        return NativeFormat("apertus", token, close_token=close) if token is not None else None
    if NEMOTRON_OPEN in template_source and NEMOTRON_CLOSE in template_source:
        token = _one_token(vocab, NEMOTRON_OPEN)
        close = _one_token(vocab, NEMOTRON_CLOSE)
        return NativeFormat("nemotron", token, close_token=close) if token is not None else None
    if KIMI_SECTION in template_source and KIMI_CALL in template_source:
        tokens = [_one_token(vocab, tag) for tag in (KIMI_SECTION, KIMI_ARGS, KIMI_SECTION_END, KIMI_CALL, KIMI_CALL_END)]
        if None in tokens:
            return None
        return NativeFormat("kimi-k2", tokens[0], tokens[1], close_token=tokens[2], tag_tokens=(tokens[3], tokens[4]))
    if DEEPSEEK_CALLS in template_source and DEEPSEEK_SEP in template_source and "```json" in template_source:
        return _opened_by("deepseek-r1", vocab, DEEPSEEK_CALLS, _tokens(vocab, DEEPSEEK_TAGS[1:]))
    if GIGACHAT_OPEN in template_source:
        token = _one_token(vocab, GIGACHAT_OPEN)
        return NativeFormat("gigachat", token) if token is not None else None
    if GRANITE_OPEN in template_source:
        token = _one_token(vocab, GRANITE_OPEN)
        return NativeFormat("granite", token) if token is not None else None
    if LFM2_SIGN in template_source:
        open_token, close_token = _one_token(vocab, LFM2_OPEN), _one_token(vocab, LFM2_CLOSE)
        if open_token is None or close_token is None:
            return None
        return NativeFormat("lfm2", open_token, close_token=close_token)
    if LLAMA3_SIGN in template_source:
        return NativeFormat("llama3", tag_tokens=_tokens(vocab, (LLAMA3_PYTHON_TAG,)))
    return None


def format_of(template: ChatTemplate, vocab: Vocab) -> NativeFormat | None:
    """`detect` for a loaded model (its template and vocabulary)."""
    return detect(template.source, vocab)


def template_tools(req: ChatRequest) -> list[dict[str, Any]]:
    """The request's tools as chat templates take them (OpenAI's form, unset fields left out)."""
    out = []
    for tool in req.tools or []:
        fn: dict[str, Any] = {"name": tool.function.name}
        if tool.function.description:
            fn["description"] = tool.function.description
        fn["parameters"] = tool.function.parameters if tool.function.parameters is not None else {
            "type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def mistral_id(call_id: str) -> str:
    """A call id as Mistral's templates take it (9 letters and digits): itself when it is one,
    else one derived from it, the same every time."""
    if MISTRAL_ID.match(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode("utf-8")).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, k = divmod(n, len(_ALNUM))
        out.append(_ALNUM[k])
    return "".join(out)


def conversation(fmt: NativeFormat, messages: list[dict[str, str]], raw: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for a template that renders tool turns itself: an assistant's calls as
    `tool_calls` with their arguments as objects (templates write them with `tojson`), tool
    results as `tool` messages; Mistral's templates get their kind of ids. A result without a
    `tool_call_id` (Ollama's clients send none) takes the id of the call it answers: the
    unanswered call of its `name`, else the first unanswered one."""
    fix_id = mistral_id if fmt.name.startswith("mistral") else (lambda i: i)
    out: list[dict[str, Any]] = []
    unanswered: list[dict[str, Any]] = []
    for msg, plain in zip(raw, messages):
        if msg.role == "assistant" and msg.tool_calls and fmt.name in CONTENT_ONLY:  # calls written into the content
            calls = [(c.function.name, arguments_value(c.function.arguments)) for c in msg.tool_calls]
            out.append({"role": "assistant", "content": (plain["content"] or "") + CONTENT_ONLY[fmt.name](calls)})
        elif msg.role == "assistant" and msg.tool_calls:
            calls = [{"id": fix_id(c.id or f"call_{k}"), "type": "function",
                      "function": {"name": c.function.name, "arguments": arguments_value(c.function.arguments)}}
                     for k, c in enumerate(msg.tool_calls)]
            unanswered = list(calls)
            out.append({"role": "assistant", "content": plain["content"], "tool_calls": calls})
        elif msg.role == "tool":
            call_id = fix_id(msg.tool_call_id) if msg.tool_call_id else _answered(unanswered, msg.name)
            unanswered = [c for c in unanswered if c["id"] != call_id]
            out.append({"role": "tool", "content": plain["content"],
                        **({"tool_call_id": call_id} if call_id else {}),
                        **({"name": msg.name} if msg.name else {})})
        else:
            out.append(plain)
    return out


def _granite_written(calls: list[tuple[str, Any]]) -> str:
    return GRANITE_OPEN + json.dumps([{"name": name, "arguments": args} for name, args in calls], ensure_ascii=False)


# Formats whose templates render only a message's content: earlier calls are written into it, as
# the model writes them.
CONTENT_ONLY = {"lfm2": pythonic_calls.written, "granite": _granite_written}


def _answered(unanswered: list[dict[str, Any]], name: str | None) -> str | None:
    """The id of the call a result with no id answers (None: no call is left)."""
    named = [c for c in unanswered if c["function"]["name"] == name]
    pick = named or unanswered
    return pick[0]["id"] if pick else None


def arguments_value(text: str) -> Any:
    """A call's arguments (JSON text, as OpenAI sends them) as the value they encode; text that
    is not JSON as it is."""
    try:
        return json.loads(text)
    except ValueError:
        return text
