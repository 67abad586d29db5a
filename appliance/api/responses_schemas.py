"""OpenAI Responses API schemas (POST /v1/responses and the stored responses' endpoints), msgspec.

Unknown request fields are ignored, as in schemas.py. Input items are decoded as JSON objects and
read by api/responses_input.py, which names the offending item in its errors. The sampling
fields chat requests have beyond OpenAI's (top_k, min_p, penalties, seed, stop, logit_bias,
grammar) and EIE's reasoning_format, chat_template_kwargs and speculative are taken too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from .schemas import BudgetTokens, ChatTokenLogprob, MaxTokens, Metadata, ReasoningEffort, SamplingKnobs


class ResponsesTool(Struct, frozen=True, omit_defaults=True):
    """A tool in the Responses form: the function's fields at the top level."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None


class ResponsesToolChoice(Struct, frozen=True, omit_defaults=True):
    type: str
    name: str | None = None


class TextFormat(Struct, frozen=True, omit_defaults=True):
    type: str  # text | json_object | json_schema
    name: str | None = None
    schema: Any = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(Struct, frozen=True):
    format: TextFormat = TextFormat("text")
    verbosity: str | None = None


class ReasoningConfig(Struct, frozen=True):
    effort: ReasoningEffort | None = None
    summary: str | None = None


IncludeValue = Literal["message.output_text.logprobs", "reasoning.encrypted_content",
                       "file_search_call.results", "web_search_call.action.sources",
                       "code_interpreter_call.outputs", "computer_call_output.output.image_url",
                       "message.input_image.image_url"]


class ResponsesRequest(SamplingKnobs, frozen=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    # a string (one user message) or a list of input items (messages, function calls and outputs)
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    include: list[IncludeValue] | None = None
    tools: Annotated[list[ResponsesTool], Meta(max_length=128)] | None = None
    tool_choice: str | ResponsesToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: bool = True
    previous_response_id: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    metadata: Metadata | None = None
    user: str | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None
    # EIE's extensions, as on chat requests
    reasoning_format: Literal["auto", "deepseek", "none"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    thinking_budget_tokens: BudgetTokens | None = None
    speculative: bool = True


# ---- the response ----------------------------------------------------------------------------


class OutputText(Struct, frozen=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = []
    logprobs: list[ChatTokenLogprob] = []


class ReasoningText(Struct, frozen=True, tag_field="type", tag="reasoning_text"):
    text: str


class MessageItem(Struct, frozen=True, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: str  # in_progress | completed | incomplete
    role: str = "assistant"
    content: list[OutputText] = []


class ReasoningItem(Struct, frozen=True, kw_only=True, tag_field="type", tag="reasoning"):
    id: str
    summary: list[Any] = []
    content: list[ReasoningText] = []
    status: str = "completed"


class FunctionCallItem(Struct, frozen=True, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text
    status: str = "completed"


OutputItem = MessageItem | ReasoningItem | FunctionCallItem


class InputTokensDetails(Struct, frozen=True):
    cached_tokens: int


class OutputTokensDetails(Struct, frozen=True):
    reasoning_tokens: int


class ResponseUsage(Struct, frozen=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(Struct, frozen=True):
    code: str
    message: str


class IncompleteDetails(Struct, frozen=True):
    reason: str  # max_output_tokens


class Response(Struct, frozen=True, kw_only=True):
    id: str
    object: str = "response"
    created_at: int
    completed_at: int | None = None
    status: str  # in_progress | completed | incomplete | failed
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = []
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: ReasoningConfig = ReasoningConfig()
    store: bool = True
    temperature: float = 1.0
    text: TextConfig = TextConfig()
    tool_choice: str | ResponsesToolChoice = "auto"
    tools: list[ResponsesTool] = []
    top_p: float = 1.0
    top_logprobs: int = 0
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}
    background: bool = False
    conversation: ConversationRef | None = None


class InputTokensRequest(ResponsesRequest, frozen=True, kw_only=True):
    """POST /v1/responses/input_tokens: a response's request, whose input may be left out (the
    conversation or previous response alone)."""

    input: str | list[Any] = []


class InputTokenCount(Struct, frozen=True):
    input_tokens: int
    object: str = "response.input_tokens"


class DeletedResponse(Struct, frozen=True):
    id: str
    object: str = "response.deleted"
    deleted: bool = True


# ---- conversations (the Conversations API) ------------------------------------------------------


class ConversationCreate(Struct, frozen=True, kw_only=True):
    items: Annotated[list[Any], Meta(max_length=20)] | None = None  # input items, as a response's
    metadata: Metadata | None = None


class ConversationUpdate(Struct, frozen=True, kw_only=True):
    metadata: Metadata


class ConversationItemsCreate(Struct, frozen=True, kw_only=True):
    items: Annotated[list[Any], Meta(min_length=1, max_length=20)]


class Conversation(Struct, frozen=True, kw_only=True):
    id: str
    object: str = "conversation"
    created_at: int
    metadata: dict[str, str] = {}


class DeletedConversation(Struct, frozen=True):
    id: str
    object: str = "conversation.deleted"
    deleted: bool = True


class ConversationRef(Struct, frozen=True):
    id: str


class InputItemList(Struct, frozen=True):
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: str = "list"
