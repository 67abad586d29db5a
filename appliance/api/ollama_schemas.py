"""Ollama API schemas (/api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps,
/api/version), msgspec. Unknown fields are ignored, as in schemas.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from .schemas import ChatTokenLogprob, LastN, Penalty, Probability, Temperature


class OllamaOptions(Struct, frozen=True, kw_only=True):
    """The per-request options. Load-time ones (num_ctx, num_gpu, num_thread, num_batch, use_mmap,
    ...) are ignored: a model's context, threads and placement are set in the config."""

    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Meta(ge=0, le=1_000_000)] | None = None
    min_p: Probability | None = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    # Ollama caps neither the stop strings nor their number, and skips an empty one
    stop: Annotated[str, Meta(max_length=512)] | list[Annotated[str, Meta(max_length=512)]] | None = None
    num_predict: Annotated[int, Meta(ge=-2, le=1_048_576)] | None = None  # -1: no limit, -2: fill the context
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repeat_last_n: LastN | None = None
    typical_p: Probability | None = None
    mirostat: Literal[0, 1, 2] | None = None
    mirostat_tau: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    mirostat_eta: Annotated[float, Meta(ge=0.0, le=10.0)] | None = None


class OllamaFunctionCall(Struct, frozen=True):
    name: str
    arguments: dict[str, Any] = {}


class OllamaToolCall(Struct, frozen=True):
    function: OllamaFunctionCall


class OllamaMessage(Struct, frozen=True, omit_defaults=True):
    role: str  # system | user | assistant | tool
    content: str | None = ""  # (null: "", as Go reads it; an assistant turn that only calls tools)
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None


class OllamaFunction(Struct, frozen=True):
    name: str
    description: str | None = None
    parameters: Any = None


class OllamaTool(Struct, frozen=True):
    function: OllamaFunction
    type: str = "function"


class _Common(Struct, frozen=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    stream: bool = True  # Ollama streams unless told not to
    format: str | dict[str, Any] | None = None  # "json" or a JSON Schema
    options: OllamaOptions | None = None
    think: bool | str | None = None  # true/false, or a level (high, medium, low): on, with the level's budget
    keep_alive: Any = None  # seconds or a Go duration (ollama_input.keep_alive_seconds)
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    # EIE's (and llama-server's) extensions, as on chat requests
    grammar: Annotated[str, Meta(min_length=1, max_length=65536)] | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    # Speculative decoding for this request (unset: off for a seeded sampled request, whose answer
    # Ollama promises repeats; a speculating draw depends on the drafts: ollama_input._chat)
    speculative: bool | None = None


class OllamaChatRequest(_Common, frozen=True, kw_only=True):
    messages: list[OllamaMessage] = []  # none: only load the model
    tools: Annotated[list[OllamaTool], Meta(max_length=128)] | None = None


class OllamaGenerateRequest(_Common, frozen=True, kw_only=True):
    prompt: str = ""  # empty: only load the model
    system: str | None = None
    raw: bool = False  # the prompt as it is, without the chat template
    template: str | None = None
    suffix: str | None = None
    images: list[Any] | None = None
    context: list[int] | None = None


class OllamaEmbedRequest(Struct, frozen=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    input: str | list[str] = ""
    prompt: str | None = None  # /api/embeddings' field
    truncate: bool = True
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    keep_alive: Any = None


class OllamaModelRequest(Struct, frozen=True, kw_only=True):
    model: str | None = None
    name: str | None = None  # the older field


# ---- answers ---------------------------------------------------------------------------------


class OllamaReply(Struct, frozen=True, omit_defaults=True):
    """The assistant's message in an answer (its content always written, "" at the end of a stream)."""

    role: str
    content: str
    thinking: str | None = None
    tool_calls: list[OllamaToolCall] | None = None


class OllamaAnswer(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A chat or generate answer, or one streamed piece of it (done: false)."""

    model: str
    created_at: str
    message: OllamaReply | None = None  # chat
    response: str | None = None  # generate
    thinking: str | None = None  # generate
    done: bool
    done_reason: str | None = None
    total_duration: int | None = None  # nanoseconds
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    logprobs: list[ChatTokenLogprob] | None = None  # OpenAI's chat form, which Ollama's is


class OllamaModelDetails(Struct, frozen=True):
    parent_model: str = ""
    format: str = "gguf"
    family: str = ""
    families: list[str] | None = None
    parameter_size: str = ""
    quantization_level: str = ""


class OllamaListedModel(Struct, frozen=True, kw_only=True):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: OllamaModelDetails


class OllamaModelList(Struct, frozen=True):
    models: list[OllamaListedModel]


class OllamaRunningModel(OllamaListedModel, frozen=True, kw_only=True):
    expires_at: str
    size_vram: int
    context_length: int


class OllamaRunningList(Struct, frozen=True):
    models: list[OllamaRunningModel]


class OllamaShownModel(Struct, frozen=True, kw_only=True):
    license: str
    modelfile: str
    parameters: str
    template: str
    details: OllamaModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class OllamaEmbeddings(Struct, frozen=True, kw_only=True):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class OllamaLegacyEmbedding(Struct, frozen=True):
    embedding: list[float]


class OllamaVersion(Struct, frozen=True):
    version: str


class OllamaError(Struct, frozen=True):
    error: str
    param: str | None = None  # EIE's addition: the offending field, as in every EIE error
