"""OpenAI's stored chat completions: a chat completion made with `store: true` is kept
(chat_completion_store.py) and read back with GET /v1/chat/completions/{id}, listed with GET
/v1/chat/completions (`model`, `metadata[key]=value`, `order`, `after`, `limit`), its messages
with GET /v1/chat/completions/{id}/messages, its metadata changed with POST
/v1/chat/completions/{id}, and deleted with DELETE; each only by the API key that made it."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import msgspec

from ..config import Config
from ..observability import context
from .chat_completion_store import ChatCompletionStore, StoredChat
from .errors import decoded
from .http import Request
from .item_pages import item_page, query_values
from .json_store import MissingRecord, not_found
from .schemas import ChatCompletion, ChatCompletionDeleted, ChatCompletionUpdate, ChatMessage, ChatRequest

log = logging.getLogger("eie.responses")
_update = msgspec.json.Decoder(ChatCompletionUpdate)
_METADATA_KEY = re.compile(r"^metadata\[(.+)\]$")
# the request's fields a stored completion shows beside the answer, as OpenAI's does
_REQUEST_FIELDS = ("seed", "temperature", "top_p", "presence_penalty", "frequency_penalty", "tools", "tool_choice",
                   "response_format")


def store_message(completion_id: str, index: int, message: ChatMessage) -> dict[str, Any]:
    """A request message as a chat completion store message: its id, its text as `content` and,
    where it was sent as parts, the parts as `content_parts`."""
    out: dict[str, Any] = {"id": f"{completion_id}-{index}", "role": message.role}
    if isinstance(message.content, list):
        out["content"] = "".join(p.text or "" for p in message.content if p.type == "text")
        out["content_parts"] = msgspec.to_builtins(message.content)
    else:
        out["content"] = message.content
        out["content_parts"] = None
    for name in ("name", "tool_calls", "tool_call_id", "function_call"):
        value = getattr(message, name)
        if value is not None:
            out[name] = msgspec.to_builtins(value)
    return out


class StoredChatRoutes:
    def __init__(self, config: Config, store: ChatCompletionStore):
        self.config = config
        self.store = store

    def keep(self, req: ChatRequest, completion: ChatCompletion) -> None:
        """Store an answer made with `store: true` (before it is sent, so that a GET right after
        finds it); one larger than server.responses.max_mb is not kept."""
        try:
            shown = msgspec.to_builtins(completion)
            info = context.info()
            shown.update({"metadata": req.metadata or {}, "request_id": info.id if info is not None else None,
                          **{name: msgspec.to_builtins(getattr(req, name, None)) for name in _REQUEST_FIELDS}})
            record = StoredChat(shown, [store_message(completion.id, i, m) for i, m in enumerate(req.messages)],
                                context.key_id(), time.time_ns())
            if not self.store.put(record):
                log.warning("chat completion %s is larger than server.responses.max_mb: not stored", completion.id)
        except Exception:  # the answer goes out all the same
            log.exception("storing chat completion %s failed", completion.id)

    def _record(self, request: Request) -> StoredChat:
        completion_id = request.path_params["completion_id"]
        try:
            return self.store.get(completion_id, context.key_id())
        except MissingRecord as e:
            raise not_found("chat_completion", e) from None

    async def listed(self, request: Request) -> None:
        """Stored completions, oldest first unless `order=desc`; `model` and each
        `metadata[key]=value` keep those that match."""
        query = query_values(request)
        wanted = {m.group(1): v for k, v in query.items() if (m := _METADATA_KEY.match(k))}
        model = query.get("model")
        records = await asyncio.to_thread(self.store.listed, context.key_id())
        shown = [r.completion for r in records
                 if (model is None or r.completion.get("model") == model)
                 and all((r.completion.get("metadata") or {}).get(k) == v for k, v in wanted.items())]
        await request.json(200, item_page(shown, request, "your stored chat completions", default_order="asc"))

    async def retrieve(self, request: Request) -> None:
        await request.json(200, self._record(request).completion)

    async def update(self, request: Request) -> None:
        """New metadata (the only thing of a stored completion that changes)."""
        body: ChatCompletionUpdate = decoded(_update, await request.body(self.config.server.limits.max_body_bytes))
        record = self._record(request)
        record = msgspec.structs.replace(record, completion={**record.completion, "metadata": body.metadata or {}})
        self.store.put(record)
        await request.json(200, record.completion)

    async def delete(self, request: Request) -> None:
        completion_id = request.path_params["completion_id"]
        try:
            self.store.delete(completion_id, context.key_id())
        except MissingRecord as e:
            raise not_found("chat_completion", e) from None
        await request.json(200, ChatCompletionDeleted(completion_id))

    async def messages(self, request: Request) -> None:
        """The messages the completion answered, first to last unless `order=desc`."""
        record = self._record(request)
        await request.json(200, item_page(record.messages, request, f"chat completion {record.completion['id']!r}",
                                          default_order="asc"))
