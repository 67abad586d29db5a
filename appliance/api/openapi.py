"""GET /openapi.json: every endpoint, with request and response schemas generated from the msgspec
structs the handlers decode and encode (msgspec.json.schema_components)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from .. import __version__
from . import admin_routes as admin
from . import anthropic_schemas as an
from . import llama_server_routes as ls
from . import ollama_schemas as ol
from . import responses_schemas as rs
from .anthropic_batches import DeletedMessageBatch, MessageBatch, MessageBatchCreate, MessageBatchList
from .batch_store import Batch, BatchCreate
from .file_store import FileObject
from .files_routes import DeletedFile
from . import schemas as s

REF = "#/components/schemas/{name}"


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    summary: str
    request: Any = None  # a msgspec Struct type, or None
    response: Any = None  # None: a JSON object described in the README
    auth: str = "key"  # open | key | admin
    query: tuple[tuple[str, str], ...] = ()  # (name, description)
    tag: str = "inference"


OPERATIONS: tuple[Op, ...] = (
    Op("post", "/v1/chat/completions", "Chat completion (stream: server-sent events)", s.ChatRequest, s.ChatCompletion),
    Op("get", "/v1/chat/completions", "Stored chat completions (made with store: true), oldest first", None,
       rs.InputItemList, query=(("model", "only those of this model"),
                                ("metadata[key]", "only those whose metadata has this value at this key"),
                                ("order", "asc or desc (default asc)"), ("limit", "1 to 100 (default 20)"),
                                ("after", "a completion id: list those after it"))),
    Op("get", "/v1/chat/completions/{completion_id}", "A stored chat completion, with its metadata", None,
       s.ChatCompletion),
    Op("post", "/v1/chat/completions/{completion_id}", "A stored chat completion's new metadata",
       s.ChatCompletionUpdate, s.ChatCompletion),
    Op("delete", "/v1/chat/completions/{completion_id}", "Delete a stored chat completion", None,
       s.ChatCompletionDeleted),
    Op("get", "/v1/chat/completions/{completion_id}/messages", "The messages a stored chat completion answered",
       None, rs.InputItemList, query=(("order", "asc or desc (default asc)"), ("limit", "1 to 100 (default 20)"),
                                      ("after", "a message id: list those after it"))),
    Op("post", "/v1/completions", "Text completion (stream: server-sent events)", s.CompletionRequest, s.Completion),
    Op("post", "/completion", "llama-server's own completion (stream: server-sent events)",
       ls.NativeCompletionRequest, ls.CompletionResult),
    Op("post", "/infill", "llama-server's fill-in-the-middle for code editors (stream: server-sent events)",
       ls.InfillRequest, ls.CompletionResult),
    Op("get", "/props", "llama-server's model properties (without `model`, a router's, as llama-server's own)",
       query=(("model", "the model whose properties are asked (loaded if need be)"),)),
    Op("get", "/lora-adapters", "llama-server's list of a model's LoRA adapters: [{id, name, path, scale}]",
       query=(("model", "a model, or one of its adapters' names"),)),
    Op("post", "/lora-adapters", "llama-server's global adapter scales: [{id, scale}] becomes the set ?model= serves",
       list[s.LoraScale], auth="admin", query=(("model", "a model, or one of its adapters' names"),)),
    Op("post", "/apply-template", "llama-server's: the prompt text a chat renders to", s.ChatRequest,
       ls.AppliedTemplate),
    Op("get", "/v1/models", "Configured models and their states", None, s.ModelList),
    Op("get", "/v1/models/{model_id}", "One model or group and its state", None, s.ModelCard),
    Op("post", "/v1/responses", "OpenAI Responses API: a response (stream: server-sent events; background: "
       "queued at once, then read with GET; both: its events, which GET with stream=true reads again)",
       rs.ResponsesRequest, rs.Response),
    Op("post", "/v1/responses/input_tokens", "The prompt tokens a response to this request would have",
       rs.InputTokensRequest, rs.InputTokenCount),
    Op("get", "/v1/responses/{response_id}", "A stored response, or a streamed background response's events",
       None, rs.Response, query=(("stream", "true: the response's events as server-sent events (a background "
                                            "response made with stream), live until it ends"),
                                 ("starting_after", "with stream: only the events after this sequence number"))),
    Op("post", "/api/chat", "Ollama API: a chat answer (stream, the default: newline-delimited JSON)",
       ol.OllamaChatRequest, ol.OllamaAnswer, tag="ollama"),
    Op("post", "/api/generate", "Ollama API: a completion (stream, the default: newline-delimited JSON)",
       ol.OllamaGenerateRequest, ol.OllamaAnswer, tag="ollama"),
    Op("post", "/api/embed", "Ollama API: embeddings", ol.OllamaEmbedRequest, ol.OllamaEmbeddings, tag="ollama"),
    Op("post", "/api/embeddings", "Ollama API: one embedding (the older endpoint)", ol.OllamaEmbedRequest,
       ol.OllamaLegacyEmbedding, tag="ollama"),
    Op("get", "/api/tags", "Ollama API: the configured models", None, ol.OllamaModelList, tag="ollama"),
    Op("get", "/api/ps", "Ollama API: the loaded models", None, ol.OllamaRunningList, tag="ollama"),
    Op("post", "/api/show", "Ollama API: a model's details, template and metadata", ol.OllamaModelRequest,
       ol.OllamaShownModel, tag="ollama"),
    Op("get", "/api/version", "Ollama API: this server's version", None, ol.OllamaVersion, tag="ollama"),
    *(Op(method, path, "Ollama API: refused (the model set is the config's)", tag="ollama")
      for path in ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete")
      for method in ("post", "delete")),
    Op("post", "/v1/messages", "Anthropic Messages API: a message (stream: server-sent events)", an.MessagesRequest,
       an.AnthropicMessage),
    Op("post", "/v1/messages/count_tokens", "Anthropic Messages API: a request's prompt tokens", an.MessagesRequest,
       an.TokenCount),
    Op("delete", "/v1/responses/{response_id}", "Delete a stored response", None, rs.DeletedResponse),
    Op("post", "/v1/responses/{response_id}/cancel", "Cancel a background response (one that has finished comes "
       "back as it is)", None, rs.Response),
    Op("get", "/v1/responses/{response_id}/input_items", "A stored response's input items", None, rs.InputItemList,
       query=(("order", "asc or desc (default desc)"), ("limit", "1 to 100 (default 20)"),
              ("after", "an item id: list the items after it"))),
    Op("post", "/v1/files", "OpenAI Files API: upload a batch input file (multipart/form-data: file, purpose "
       "batch)", None, FileObject),
    Op("get", "/v1/files", "Your files, newest first", None, rs.InputItemList,
       query=(("purpose", "only files of this purpose (batch, batch_output)"), ("order", "asc or desc (default desc)"),
              ("limit", "1 to 10000 (default 10000)"), ("after", "a file id: list the files after it"))),
    Op("get", "/v1/files/{file_id}", "A file's description", None, FileObject),
    Op("delete", "/v1/files/{file_id}", "Delete a file", None, DeletedFile),
    Op("get", "/v1/files/{file_id}/content", "A file's bytes (a batch's results: JSON lines)"),
    Op("post", "/v1/batches", "OpenAI Batch API: run a file of requests in the background", BatchCreate, Batch),
    Op("get", "/v1/batches", "Your batches, newest first", None, rs.InputItemList,
       query=(("limit", "1 to 100 (default 20)"), ("after", "a batch id: list the batches after it"))),
    Op("get", "/v1/batches/{batch_id}", "A batch: its status, request counts and result files", None, Batch),
    Op("post", "/v1/batches/{batch_id}/cancel", "Cancel a batch (one that has finished comes back as it is)",
       None, Batch),
    Op("post", "/v1/messages/batches", "Anthropic Message Batches API: run `requests` ([{custom_id, params}]) in "
       "the background", MessageBatchCreate, MessageBatch),
    Op("get", "/v1/messages/batches", "Your message batches, newest first", None, MessageBatchList,
       query=(("limit", "1 to 1000 (default 20)"), ("after_id", "a batch id: the batches after it"),
              ("before_id", "a batch id: the batches before it"))),
    Op("get", "/v1/messages/batches/{batch_id}", "A message batch", None, MessageBatch),
    Op("delete", "/v1/messages/batches/{batch_id}", "Delete an ended message batch and its results", None,
       DeletedMessageBatch),
    Op("post", "/v1/messages/batches/{batch_id}/cancel", "Cancel a message batch", None, MessageBatch),
    Op("get", "/v1/messages/batches/{batch_id}/results", "An ended message batch's results (JSON lines)"),
    Op("post", "/v1/conversations", "OpenAI Conversations API: a conversation (its first items, metadata)",
       rs.ConversationCreate, rs.Conversation),
    Op("get", "/v1/conversations/{conversation_id}", "A conversation", None, rs.Conversation),
    Op("post", "/v1/conversations/{conversation_id}", "A conversation's new metadata", rs.ConversationUpdate,
       rs.Conversation),
    Op("delete", "/v1/conversations/{conversation_id}", "Delete a conversation", None, rs.DeletedConversation),
    Op("get", "/v1/conversations/{conversation_id}/items", "A conversation's items", None, rs.InputItemList,
       query=(("order", "asc or desc (default desc)"), ("limit", "1 to 100 (default 20)"),
              ("after", "an item id: list the items after it"))),
    Op("post", "/v1/conversations/{conversation_id}/items", "Items added at a conversation's end (1 to 20): "
       "the list of those added", rs.ConversationItemsCreate, rs.InputItemList),
    Op("get", "/v1/conversations/{conversation_id}/items/{item_id}", "One item of a conversation"),
    Op("delete", "/v1/conversations/{conversation_id}/items/{item_id}", "Delete an item: the conversation",
       None, rs.Conversation),
    Op("post", "/v1/embeddings", "Embeddings from an embedding model", s.EmbeddingRequest, s.EmbeddingList),
    Op("post", "/v1/rerank", "Documents scored against a query by a reranker", s.RerankRequest, s.RerankResponse),
    Op("post", "/rerank", "The same as /v1/rerank", s.RerankRequest, s.RerankResponse),
    Op("post", "/tokenize", "A model's tokens for a text or a chat", s.TokenizeRequest, s.TokenizeResponse),
    Op("post", "/detokenize", "The text of a model's tokens", s.DetokenizeRequest, s.DetokenizeResponse),
    Op("post", "/v1/batch/execute", "Run a parallel or fanout model group", s.GroupRequest, s.GroupExecution,
       tag="groups"),
    Op("post", "/v1/chain/execute", "Run a sequential model group", s.GroupRequest, s.GroupExecution, tag="groups"),
    Op("get", "/health", "Readiness: 200 ok; 503 loading, degraded or draining", auth="open", tag="operations"),
    Op("get", "/metrics", "Prometheus metrics (text format)", auth="metrics", tag="operations"),
    Op("get", "/", "Ollama's heartbeat: 200 \"Ollama is running\" (its CLI asks HEAD / first)", auth="open",
       tag="operations"),
    Op("get", "/openapi.json", "This document", auth="open", tag="operations"),
    Op("get", "/v1/admin/vram/status", "Memory per device, model and budget", auth="admin", tag="admin"),
    Op("get", "/v1/admin/scheduling/status", "Strategy, queues, groups, counters, events", auth="admin", tag="admin"),
    Op("post", "/v1/admin/models/load", "Load a configured model", admin.ModelAction, auth="admin", tag="admin"),
    Op("post", "/v1/admin/models/unload", "Unload a model", admin.ModelAction, auth="admin", tag="admin"),
    Op("get", "/v1/admin/models/discover", "GGUF files under model_dir", auth="admin", tag="admin",
       query=(("path", "a directory inside model_dir"),)),
    Op("post", "/v1/admin/kv/convert", "Change a loaded model's KV cache types", admin.KvConvert, auth="admin",
       tag="admin"),
    Op("post", "/v1/admin/kv/warm", "Prefill and save a prefix", admin.KvWarm, auth="admin", tag="admin"),
    Op("get", "/v1/admin/kv/status", "Prefix cache per model", auth="admin", tag="admin"),
    Op("post", "/v1/admin/kv/flush", "Drop saved prefixes", admin.KvFlush, auth="admin", tag="admin"),
    Op("post", "/v1/admin/config/reload", "Re-read the config file", auth="admin", tag="admin"),
)

_ERRORS = {"400": "invalid request (the field is named in error.param)", "401": "missing or invalid API key",
           "403": "the key may not use this endpoint", "404": "unknown model, group or path",
           "413": "body too large", "429": "rate, concurrency or queue limit (Retry-After)",
           "503": "loading, not ready, or draining"}


def _examples(models: list[str], groups: list[tuple[str, str]]) -> dict[Any, Any]:
    """A valid body per request type (and per group endpoint), with this server's names."""
    model = models[0] if models else "model"
    msgs = [{"role": "user", "content": "Hello"}]
    chain = next((n for n, t in groups if t == "sequential"), "chain")
    batch = next((n for n, t in groups if t != "sequential"), "group")
    return {
        s.ChatRequest: {"model": model, "messages": msgs, "max_tokens": 4},
        s.CompletionRequest: {"model": model, "prompt": "Hello", "max_tokens": 4},
        ls.InfillRequest: {"model": model, "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 4},
        ls.NativeCompletionRequest: {"model": model, "prompt": "Hello", "n_predict": 4},
        rs.ResponsesRequest: {"model": model, "input": "Hello", "max_output_tokens": 4},
        "/v1/messages": {"model": model, "max_tokens": 4, "messages": msgs},
        "/v1/messages/count_tokens": {"model": model, "messages": msgs},
        ol.OllamaChatRequest: {"model": model, "messages": msgs, "stream": False, "options": {"num_predict": 4}},
        ol.OllamaGenerateRequest: {"model": model, "prompt": "Hello", "stream": False, "options": {"num_predict": 4}},
        ol.OllamaModelRequest: {"model": model},
        "/v1/batch/execute": {"group": batch, "messages": msgs, "max_tokens": 4},
        "/v1/chain/execute": {"group": chain, "messages": msgs, "max_tokens": 4},
        admin.ModelAction: {"model": model},
        admin.KvConvert: {"model": model, "mode": "q8_0"},
        admin.KvWarm: {"model": model, "prompt": "You are a helpful assistant."},
        admin.KvFlush: {"model": model},
        "/lora-adapters": [],  # (POST: no adapter on; the ids are each model's)
    }


def build(metrics_auth: str = "open", models: list[str] | None = None,
          groups: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """The document; with `models` and `groups` (name, type), their names appear as examples
    (and in example bodies)."""
    examples = _examples(models or [], groups or [])
    types = [op.request for op in OPERATIONS if op.request] + [op.response for op in OPERATIONS if op.response]
    envelopes = [s.ErrorEnvelope, an.AnthropicErrorEnvelope, ol.OllamaError]
    refs, components = msgspec.json.schema_components(types + envelopes, ref_template=REF)
    by_type = dict(zip(types + envelopes, refs))
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        auth = metrics_auth if op.auth == "metrics" else op.auth
        entry: dict[str, Any] = {"summary": op.summary, "tags": [op.tag], "operationId": _op_id(op)}
        if auth != "open":
            entry["security"] = [{"bearer": []}]
        parameters = [{"name": part[1:-1], "in": "path", "required": True, "schema": {"type": "string"}}
                      for part in op.path.split("/") if part.startswith("{")]
        parameters += [{"name": n, "in": "query", "required": False, "description": d,
                        "schema": {"type": "string"}} for n, d in op.query]
        if parameters:
            entry["parameters"] = parameters
        if op.request is not None:
            media: dict[str, Any] = {"schema": by_type[op.request]}
            if models is not None:
                media["example"] = examples.get(op.path, examples.get(op.request))
            entry["requestBody"] = {"required": True, "content": {"application/json": media}}
        ok: dict[str, Any] = {"description": "success"}
        if op.path in ("/metrics", "/"):
            ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
        else:
            schema = by_type[op.response] if op.response is not None else {"type": "object"}
            ok["content"] = {"application/json": {"schema": schema}}
            if op.path in ("/v1/chat/completions", "/v1/completions", "/v1/batch/execute", "/v1/chain/execute",
                           "/v1/responses", "/v1/messages", "/infill", "/completion") or (
                               op.method == "get" and op.path == "/v1/responses/{response_id}"):
                ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
            if op.path in ("/api/chat", "/api/generate"):
                ok["content"]["application/x-ndjson"] = {"schema": {"type": "string"}}
        responses = {"200": ok}
        for code, desc in _ERRORS.items():
            if code in ("401", "403") and auth == "open":
                continue
            envelope = (an.AnthropicErrorEnvelope if op.path.startswith("/v1/messages") else
                        ol.OllamaError if op.path.startswith("/api/") else s.ErrorEnvelope)
            responses[code] = {"description": desc, "content": {"application/json": {"schema": by_type[envelope]}}}
        entry["responses"] = responses
        paths.setdefault(op.path, {})[op.method] = entry
    for name, key, values in (("ChatRequest", "model", models), ("CompletionRequest", "model", models),
                              ("InfillRequest", "model", models), ("NativeCompletionRequest", "model", models),
                              ("ResponsesRequest", "model", models), ("MessagesRequest", "model", models),
                              ("OllamaChatRequest", "model", models), ("OllamaGenerateRequest", "model", models),
                              ("GroupRequest", "group", [n for n, _ in groups or []]),
                              ("ModelAction", "model", models),
                              ("KvConvert", "model", models), ("KvWarm", "model", models),
                              ("KvFlush", "model", models)):
        prop = components.get(name, {}).get("properties", {}).get(key)
        if prop is not None and values:
            prop["examples"] = list(values)
    return {
        "openapi": "3.1.0",
        "info": {"title": "EIE edge inference appliance", "version": __version__},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _op_id(op: Op) -> str:
    return op.method + op.path.replace("/", "_").replace(".", "_").replace("-", "_").replace("{", "").replace("}", "")
