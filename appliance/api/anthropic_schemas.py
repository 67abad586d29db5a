"""Anthropic Messages API schemas (POST /v1/messages, POST /v1/messages/count_tokens), msgspec.

Unknown request fields are ignored, as in schemas.py. Content blocks are decoded as JSON objects
and read by api/anthropic_input.py, which names the offending block in its errors; the sampling
fields chat requests have beyond Anthropic's (min_p, penalties, seed, logit_bias, grammar) and
EIE's reasoning_format, chat_template_kwargs and speculative are taken too."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from .schemas import MaxTokens, SamplingKnobs


class AnthropicTool(Struct, frozen=True):
    name: str
    description: str | None = None
    input_schema: Any = None
    type: str | None = None  # absent or "custom"; Anthropic's server tools are refused
    cache_control: Any = None


class AnthropicToolChoice(Struct, frozen=True):
    type: str  # auto | any | tool | none
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingConfig(Struct, frozen=True):
    type: str  # enabled | disabled (adaptive: as enabled)
    budget_tokens: int | None = None


class OutputFormat(Struct, frozen=True):
    type: str  # json_schema
    schema: Any = None


class OutputConfig(Struct, frozen=True):
    format: OutputFormat | None = None  # structured output: the answer's text is JSON of this schema


class MessageParam(Struct, frozen=True):
    role: Literal["user", "assistant"]
    content: str | list[Any]


class MessagesRequest(SamplingKnobs, frozen=True, kw_only=True):
    """A message request, and a count_tokens request (the same fields less max_tokens)."""

    model: Annotated[str, Meta(min_length=1, max_length=256)]
    messages: Annotated[list[MessageParam], Meta(min_length=1)]
    max_tokens: MaxTokens | None = None  # required by /v1/messages (checked there)
    system: str | list[Any] | None = None
    stop_sequences: Annotated[list[Annotated[str, Meta(min_length=1, max_length=512)]], Meta(max_length=16)] | None = None
    tools: Annotated[list[AnthropicTool], Meta(max_length=128)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's name for output_config.format
    metadata: dict[str, Any] | None = None  # (user_id)
    service_tier: str | None = None
    # EIE's extensions, as on chat requests
    reasoning_format: Literal["auto", "deepseek", "none"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    speculative: bool = True


# ---- the answer ------------------------------------------------------------------------------


class TextBlock(Struct, frozen=True, tag_field="type", tag="text"):
    text: str


class ThinkingBlock(Struct, frozen=True, tag_field="type", tag="thinking"):
    thinking: str
    signature: str = ""  # nothing is signed here; a block sent back is left out of the prompt


class ToolUseBlock(Struct, frozen=True, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: Any  # the arguments, a JSON object


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock


class AnthropicUsage(Struct, frozen=True):
    input_tokens: int  # the prompt tokens that were prefilled (not restored from the cache)
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0  # the prompt tokens restored from the prefix cache


class AnthropicMessage(Struct, frozen=True, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: str | None  # end_turn | max_tokens | stop_sequence | tool_use
    stop_sequence: str | None = None
    usage: AnthropicUsage


class TokenCount(Struct, frozen=True):
    input_tokens: int


class AnthropicErrorBody(Struct, frozen=True):
    type: str  # invalid_request_error, authentication_error, not_found_error, ...
    message: str
    param: str | None = None  # EIE's addition: the offending field, as in every EIE error


class AnthropicErrorEnvelope(Struct, frozen=True):
    error: AnthropicErrorBody
    type: str = "error"


class AnthropicModel(Struct, frozen=True):
    id: str
    display_name: str
    created_at: str  # RFC 3339
    type: str = "model"
    lifecycle: str = "active"
    max_input_tokens: int | None = None  # the model's n_ctx here


class AnthropicModelList(Struct, frozen=True):
    data: list[AnthropicModel]
    first_id: str | None
    last_id: str | None
    has_more: bool = False
