"""Chat prompts rendered with the model's own Jinja template (`tokenizer.chat_template`)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Iterator

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment


class TemplateError(ValueError):
    """The messages cannot be rendered by this model's template (e.g. roles out of order)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _listed(value: Any) -> list[Any]:
    """A filter's lazy sequence (`map`, `select`) as the list it yields, for JSON; anything else
    is no JSON value."""
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """`tojson` as Hugging Face's chat templates have it: plain JSON, not Jinja's HTML-escaped form
    (tool lists and call arguments are written into the prompt with it). A filter's lazy sequence
    is written as its list, as llama.cpp's renderer writes it (its DeepSeek R1 template lists the
    tools with `tools | map(attribute='function') | tojson`)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=tuple(separators) if separators else None, sort_keys=sort_keys, default=_listed)


# The variables render() sets, which chat_template_kwargs may not give.
RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "raise_exception",
                      "strftime_now"})


class _GenerationTag(jinja2.ext.Extension):
    """Hugging Face's `{% generation %}...{% endgeneration %}`, which marks the assistant's text for
    training masks (LFM2.5, Laguna and other templates use it): rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[Any]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# List methods a template may call: Kimi K2's templates queue their calls' ids with append and
# pop(0), as llama.cpp's renderer lets them (each render gets its own messages and tools).
_LIST_GROWTH = frozenset({"append", "extend", "insert", "pop"})


class _Environment(ImmutableSandboxedEnvironment):
    """Hugging Face's sandbox (no mutation of the values passed in), but lists may grow and
    shrink."""

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in _LIST_GROWTH:
            return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)


class ChatTemplate:
    def __init__(self, source: str, bos_token: str, eos_token: str):
        # the extensions Hugging Face's renderer has: templates use {% break %}, {% generation %}
        env = _Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined,
                           extensions=["jinja2.ext.loopcontrols", _GenerationTag])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        self.source = source
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template does not compile: {e}") from e
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None,
               continue_final: bool = False) -> str:
        """The prompt; `extra` adds variables (chat_template_kwargs), never in place of these.
        `continue_final`: the last message is the assistant's answer begun (a prefill), and the
        prompt ends where its text does, for the model to go on with it (an empty one is
        left out: the answer starts afresh)."""
        if continue_final:
            if not (messages[-1].get("content") or "").strip():
                messages, continue_final = messages[:-1], False
            else:
                add_generation_prompt = False
        try:
            try:
                text = self._render(messages, add_generation_prompt, tools, extra)
            except TemplateError:
                # A template that takes only alternating turns (Gemma's, Mistral's) refuses two user
                # (or assistant) messages in a row, which every chat API allows: they go as one turn.
                if (merged := _merged_turns(messages)) is None:
                    raise
                text = self._render(merged, add_generation_prompt, tools, extra)
            return _cut_after_final(text, messages[-1]["content"]) if continue_final else text
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise TemplateError(f"chat template failed on these messages: {e}") from e

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None, extra: dict[str, Any] | None) -> str:
        return self._template.render(**(extra or {}), messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token, eos_token=self.eos_token, tools=tools)


def _merged_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The messages with each run of text messages of one role (user, assistant, system) as one,
    their texts joined by a blank line; None where no two follow each other."""
    out: list[dict[str, Any]] = []
    for m in messages:
        prev = out[-1] if out else None
        if (prev is not None and prev["role"] == m.get("role") and m.get("role") in ("user", "assistant", "system")
                and set(prev) == set(m) == {"role", "content"}
                and isinstance(prev["content"], str) and isinstance(m["content"], str)):
            out[-1] = {"role": prev["role"], "content": prev["content"] + "\n\n" + m["content"]}
        else:
            out.append(m)
    return out if len(out) < len(messages) else None


def _cut_after_final(text: str, final: str) -> str:
    """The rendered conversation up to the end of the final message's text, so that its end of
    turn (and whatever follows) goes. A template that trims the text (Gemma's) shows it trimmed."""
    for shown in (final, final.strip()):
        at = text.rfind(shown)
        if at >= 0:
            return text[: at + len(shown)]
    raise TemplateError("the chat template changes the final assistant message's text, so the answer "
                        "cannot go on from it")


# Formats for GGUF files that carry no `tokenizer.chat_template`, by `general.architecture` prefix.
GEMMA = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('conversation roles must alternate user/assistant/user/...') }}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n'"
    " + (prefix if loop.first else '') + m['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_BY_ARCHITECTURE = (("gemma", GEMMA),)


def default_template(metadata: dict[str, str]) -> str:
    """The GGUF's own template, else the known format of its architecture, else ChatML."""
    own = metadata.get("tokenizer.chat_template")
    if own:
        return own
    arch = metadata.get("general.architecture", "")
    for prefix, source in _BY_ARCHITECTURE:
        if arch.startswith(prefix):
            return source
    return CHATML
