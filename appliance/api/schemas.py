"""OpenAI-compatible request and response schemas (msgspec).

Unknown request fields are ignored, as OpenAI-compatible servers do, so newer SDKs keep
working; fields we know but cannot honour are refused by the handlers with the field named.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
MaxTokens = Annotated[int, Meta(ge=1, le=1_048_576)]
StopList = Annotated[list[Annotated[str, Meta(min_length=1, max_length=512)]], Meta(max_length=16)]
# OpenAI's metadata: up to 16 pairs, keys up to 64 characters, values up to 512
Metadata = Annotated[dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
                     Meta(max_length=16)]


class TextPart(Struct, frozen=True, forbid_unknown_fields=False):
    type: str
    text: str | None = None
    refusal: str | None = None  # an assistant's refusal part (OpenAI's), read as its text


class FunctionCall(Struct, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    arguments: str = "{}"  # JSON text, as OpenAI sends it


class ToolCall(Struct, frozen=True, kw_only=True):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(Struct, frozen=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    function_call: FunctionCall | None = None  # the deprecated form of one call (legacy_functions.py)


class FunctionDef(Struct, frozen=True):
    name: str
    description: str | None = None
    parameters: Any = None  # a JSON Schema
    strict: bool | None = None


class Tool(Struct, frozen=True):
    type: str
    function: FunctionDef


class ToolChoiceFunction(Struct, frozen=True):
    name: str


class ToolChoice(Struct, frozen=True):
    type: str
    function: ToolChoiceFunction | None = None


class StreamOptions(Struct, frozen=True):
    include_usage: bool = False


class JsonSchemaFormat(Struct, frozen=True):
    name: str | None = None
    schema: Any = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Struct, frozen=True):
    type: str = "text"
    json_schema: JsonSchemaFormat | None = None
    # llama-server's form: {"type": "json_object", "schema": {...}}
    schema: Any = None


LastN = Annotated[int, Meta(ge=-1, le=1_048_576)]  # tokens looked back at; -1: the context, 0: off
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]
BudgetTokens = Annotated[int, Meta(ge=-1, le=1_048_576)]  # a think block's tokens; -1: no bound


class SamplingKnobs(Struct, frozen=True, kw_only=True):
    """The sampling fields chat, completions, group and Responses requests share."""

    temperature: Temperature = 1.0
    top_p: Probability = 1.0
    top_k: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    min_p: Probability = 0.0
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] = 1.0
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    stop: Annotated[str, Meta(min_length=1, max_length=512)] | StopList | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    # llama-server's extension: a GBNF grammar (start symbol `root`) the output must follow.
    grammar: Annotated[str, Meta(min_length=1, max_length=65536)] | None = None
    stream: bool = False
    # llama-server's further samplers (engine/sampling.py build_chain), with its names and defaults.
    repeat_last_n: LastN = 64
    dry_multiplier: Annotated[float, Meta(ge=0.0, le=100.0)] = 0.0
    dry_base: Annotated[float, Meta(ge=1.0, le=100.0)] = 1.75
    dry_allowed_length: Annotated[int, Meta(ge=0, le=10_000)] = 2
    dry_penalty_last_n: LastN = -1
    dry_sequence_breakers: Annotated[list[Annotated[str, Meta(min_length=1, max_length=40)]],
                                     Meta(max_length=64)] | None = None  # None: "\n", ":", "\"", "*"
    top_n_sigma: Annotated[float, Meta(ge=-1.0, le=1000.0)] = -1.0
    typical_p: Probability = 1.0
    xtc_probability: Probability = 0.0
    xtc_threshold: Probability = 0.1
    dynatemp_range: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.0
    dynatemp_exponent: Annotated[float, Meta(ge=0.0, le=100.0)] = 1.0
    mirostat: Literal[0, 1, 2] = 0
    mirostat_tau: Annotated[float, Meta(ge=0.0, le=100.0)] = 5.0
    mirostat_eta: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.1


# The SamplingKnobs fields beyond OpenAI's that API adapters hand on to a chat request as they are.
EXTRA_SAMPLERS = ("repeat_last_n", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                  "dry_sequence_breakers", "top_n_sigma", "typical_p", "xtc_probability", "xtc_threshold",
                  "dynatemp_range", "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta")


def extra_samplers(req: SamplingKnobs) -> dict[str, Any]:
    return {name: getattr(req, name) for name in EXTRA_SAMPLERS}


class SamplingOptions(SamplingKnobs, frozen=True, kw_only=True):
    max_tokens: MaxTokens | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None


class LoraScale(Struct, frozen=True, forbid_unknown_fields=True):
    """llama-server's per-request adapter: the index of one of the model's models[].lora, and its scale."""

    id: Annotated[int, Meta(ge=0, le=15)]
    scale: Annotated[float, Meta(ge=-16.0, le=16.0)]


class SamplingFields(SamplingOptions, frozen=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    # EIE extension: false opts this request out of speculative decoding.
    speculative: bool = True
    # llama-server's: the model's LoRA adapters this request decodes with, by index (unlisted: 0),
    # in place of the set its model name gives (api/generation.py request_adapters).
    lora: Annotated[list[LoraScale], Meta(max_length=16)] | None = None


class Prediction(Struct, frozen=True):
    type: Literal["content"]
    content: Annotated[str, Meta(max_length=4_194_304)] | list[TextPart]


class ChatRequest(SamplingFields, frozen=True, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    logprobs: bool | None = None
    max_completion_tokens: MaxTokens | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    tool_choice: str | ToolChoice | None = None
    parallel_tool_calls: bool = True
    # A think block (<think>...</think>) as `reasoning_content` (auto; deepseek: the same) or
    # left in the content (none); see engine/reasoning.py. Unset: models[].reasoning_format.
    reasoning_format: Literal["auto", "deepseek", "none"] | None = None
    # Variables for the chat template (e.g. Qwen3's enable_thinking), over models[].chat_template_kwargs.
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's: none and minimal set the template's enable_thinking false, the others true; an
    # effort listed in models[].reasoning_effort_budgets bounds the think block with its budget.
    reasoning_effort: ReasoningEffort | None = None
    # llama-server's: tokens the think block may take before the server closes it (-1: no bound),
    # over the effort's budget and models[].reasoning_budget.
    thinking_budget_tokens: BudgetTokens | None = None
    # OpenAI's predicted outputs: the answer expected (most of it), a draft source for speculative
    # decoding (where the model speculates); the answer is the model's all the same.
    prediction: Prediction | None = None
    # The deprecated form of tools and tool_choice (api/legacy_functions.py).
    functions: Annotated[list[FunctionDef], Meta(max_length=128)] | None = None
    function_call: Literal["none", "auto"] | ToolChoiceFunction | None = None
    # OpenAI's stored chat completions: keep the answer and its messages for GET
    # /v1/chat/completions/{id} and the list (api/chat_completion_routes.py), with its metadata.
    store: bool = False
    metadata: Metadata | None = None
    # OpenAI's fields this server cannot honour, decoded only to be refused by name (ignoring
    # them would answer another question): audio output, web search.
    audio: Any = None
    modalities: list[str] | None = None
    web_search_options: Any = None
    # vLLM's: the last message is the assistant's answer begun (a prefill), which the model goes
    # on with, its text left out of the answer (Anthropic's and Ollama's chat do this by themselves).
    continue_final_message: bool = False


class CompletionRequest(SamplingFields, frozen=True, kw_only=True):
    # A string, a list of strings, a list of token ids or a list of token-id lists (checked by the handler).
    prompt: str | list[str | int | list[int]]
    # 0 only with echo: the prompt alone, scored when logprobs is set (OpenAI's legacy form).
    max_tokens: Annotated[int, Meta(ge=0, le=1_048_576)] | None = None
    # Per-token log-probabilities with this many alternatives (OpenAI allows up to 5).
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    # The prompt's text before the answer; with logprobs, each prompt token's log-probability too.
    echo: bool = False
    suffix: str | None = None
    # Candidates generated per prompt, of which the n with the highest mean token log-probability
    # come back (OpenAI's legacy best_of; not streamed).
    best_of: Annotated[int, Meta(ge=1, le=16)] | None = None


class TokenizeRequest(Struct, frozen=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    # exactly one: text as a completions prompt, or messages as the chat endpoint renders them
    content: str | None = None
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | None = None
    # messages only: as a chat request with these tools would render them
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    tool_choice: str | ToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # text only: BOS/EOS as the model's tokenizer adds them (a completions prompt gets them)
    add_special: bool = True
    # text only: special tokens written in the text (<|im_end|>) become those tokens
    parse_special: bool = False
    with_pieces: bool = False


class TokenPiece(Struct, frozen=True):
    id: int
    piece: str | list[int]  # its text, or (as llama-server) its bytes where they are not UTF-8 alone


class TokenizeResponse(Struct, frozen=True):
    model: str
    tokens: list[int | TokenPiece]  # ids, or with_pieces: {id, piece}
    count: int
    max_context: int  # the model's n_ctx: prompt and answer together


class DetokenizeRequest(Struct, frozen=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    tokens: list[int]


class DetokenizeResponse(Struct, frozen=True):
    model: str
    content: str


class EmbeddingRequest(Struct, frozen=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    # A string, a list of strings, a list of token ids or a list of token-id lists (checked by the handler).
    input: str | list[str | int | list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


class Embedding(Struct, frozen=True):
    index: int
    embedding: list[float] | str  # base64: little-endian float32
    object: str = "embedding"


class EmbeddingUsage(Struct, frozen=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct, frozen=True):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


class RerankDocument(Struct, frozen=True, forbid_unknown_fields=True):
    text: str


class RerankRequest(Struct, frozen=True, kw_only=True):
    """POST /v1/rerank, as Jina's, Cohere's and llama-server's: documents as strings or {"text"}."""
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    query: str
    documents: list[str | RerankDocument]
    top_n: Annotated[int, Meta(ge=1)] | None = None
    return_documents: bool = False


class RerankResult(Struct, frozen=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(Struct, frozen=True):
    model: str
    results: list[RerankResult]
    usage: EmbeddingUsage
    object: str = "list"


class GroupRequest(SamplingOptions, frozen=True, kw_only=True):
    group: Annotated[str, Meta(min_length=1, max_length=256)]
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    # each member's think block apart (auto, deepseek) or left in its text (none); unset: each
    # member model's models[].reasoning_format
    reasoning_format: Literal["auto", "deepseek", "none"] | None = None
    # as on chat, for each member (with its model's effort budgets)
    reasoning_effort: ReasoningEffort | None = None
    thinking_budget_tokens: BudgetTokens | None = None


# ---- responses -------------------------------------------------------------------------------


class PromptTokensDetails(Struct, frozen=True):
    cached_tokens: int  # prompt tokens whose KV was restored (prefix cache, a live sequence), not computed


class CompletionTokensDetails(Struct, frozen=True):
    reasoning_tokens: int = 0  # generated inside a think block (engine/reasoning.py BudgetWatch)
    # a request's prediction: its tokens the model compared as drafts and took, and those it refused
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(Struct, frozen=True, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None  # where the answer thought


class AssistantMessage(Struct, frozen=True, omit_defaults=True):
    role: str
    content: str | None  # null when the answer is tool calls
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # a think block (engine/reasoning.py)
    function_call: FunctionCall | None = None  # the call, where the request sent the legacy functions


class TopLogprob(Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct, frozen=True):
    content: list[ChatTokenLogprob]


class CompletionLogprobs(Struct, frozen=True):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChatChoice(Struct, frozen=True):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: ChatLogprobs | None = None


class ChatCompletion(Struct, frozen=True):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: str | None = None


class ChatCompletionUpdate(Struct, frozen=True, kw_only=True):
    """POST /v1/chat/completions/{id}: a stored completion's new metadata (null: none)."""

    metadata: Metadata | None


class ChatCompletionDeleted(Struct, frozen=True):
    id: str
    object: str = "chat.completion.deleted"
    deleted: bool = True


class FunctionCallDelta(Struct, frozen=True, omit_defaults=True):
    arguments: str  # always there, "" at first: clients add the pieces up
    name: str | None = None


class ToolCallDelta(Struct, frozen=True, omit_defaults=True):
    """A streamed call's piece: the first has its id, type and name, the rest more arguments."""

    index: int
    function: FunctionCallDelta
    id: str | None = None
    type: str | None = None


class Delta(Struct, frozen=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None
    function_call: FunctionCallDelta | None = None  # legacy functions: the call's pieces


class ChatChunkChoice(Struct, frozen=True):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(Struct, frozen=True):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: Usage | None = None


class CompletionChoice(Struct, frozen=True):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(Struct, frozen=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    system_fingerprint: str | None = None
    usage: Usage | None = None


class ModelCard(Struct, frozen=True):
    id: str
    created: int
    owned_by: str
    state: str
    object: str = "model"
    # EIE's: what the model serves (chat, embedding, rerank), its context, and once it is loaded,
    # its tool-call format (hermes: its own; eie: EIE's JSON) and whether it thinks in <think> blocks
    kind: str = "chat"  # chat | embedding | rerank | group (a model group asked as a chat model)
    context_length: int = 0
    tool_format: str | None = None
    reasoning: bool | None = None
    group_type: str | None = None  # a group's: parallel | sequential | fanout
    members: list[str] | None = None  # a group's models
    adapter_of: str | None = None  # a LoRA adapter's: the model it is served on (models[].lora)
    control_vectors: list[str] | None = None  # the files steering it (models[].control_vectors)


class ModelList(Struct, frozen=True):
    data: list[ModelCard]
    object: str = "list"


class ErrorBody(Struct, frozen=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(Struct, frozen=True):
    error: ErrorBody


encoder = msgspec.json.Encoder()


class MemberOut(Struct, frozen=True):
    index: int
    model: str
    status: str
    text: str
    finish_reason: str | None
    usage: Usage
    latency_ms: float
    attempts: int
    error: str | None = None
    replaced_by: str | None = None
    mean_logprob: float | None = None
    reasoning_content: str | None = None  # the member's think block (its `text` is the answer after it)


class SelectedOut(Struct, frozen=True):
    index: int
    model: str
    reason: str


class GroupExecution(Struct, frozen=True):
    id: str
    created: int
    group: str
    type: str
    complete: bool
    members: list[MemberOut]
    usage: Usage
    output: str | None = None
    selected: SelectedOut | None = None
    object: str = "group.execution"


class GroupFailure(Struct, frozen=True):
    """The body of a 502 from a failed group (strict, or no member answered): the error and every member's result."""

    error: ErrorBody
    result: GroupExecution


class MemberDelta(Struct, frozen=True, omit_defaults=True, tag_field="type", tag="member.delta"):
    index: int
    model: str  # the model writing it: a replacement's once the member is replaced
    text: str
    reasoning_content: str | None = None
    # 1, then 2 for a member's second attempt (retry_once, replace_with): its text starts over,
    # the first attempt's deltas are void
    attempt: int = 1


class MemberDone(Struct, frozen=True, tag_field="type", tag="member.done"):
    member: MemberOut


class GroupDone(Struct, frozen=True, tag_field="type", tag="group.done"):
    result: GroupExecution
    error: ErrorBody | None = None
