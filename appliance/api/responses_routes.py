"""OpenAI's Responses API: POST /v1/responses (whole, streamed or in the background), and the
stored responses: GET and DELETE /v1/responses/{response_id}, GET
/v1/responses/{response_id}/input_items, POST /v1/responses/{response_id}/cancel.

A request is asked as a chat request would ask it (api/responses_input.py): the same prompt,
sampling, tools, structured output and think blocks; only the answer's form differs."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from ..config import Config
from ..engine.manager import ModelManager
from ..engine.runner import ModelRunner
from ..observability import context
from . import responses_input
from . import responses_truncation as truncation
from .answer_relay import chat_max_tokens, relay_chat
from .group_chat import GroupChat
from .errors import ApiError, bad_request, decoded
from .generation import (
    chat_answer_plan,
    chat_prompt,
    errors_renamed,
    generation_runner,
)
from .event_log import EventLog
from .http import EventStream, Request
from .item_pages import item_page
from .conversation_store import ConversationStore
from .json_store import MissingRecord, not_found
from .response_store import UNFINISHED, ResponseStore
from .responses_background import BackgroundResponses
from .responses_output import ResponseEvents
from .responses_schemas import (
    ConversationRef,
    DeletedResponse,
    FunctionCallItem,
    InputTokenCount,
    InputTokensRequest,
    MessageItem,
    ReasoningConfig,
    Response,
    ResponsesRequest,
    TextConfig,
)
from .schemas import ChatMessage, FunctionCall, ToolCall

_decoder = msgspec.json.Decoder(ResponsesRequest)
_count_decoder = msgspec.json.Decoder(InputTokensRequest)
log = logging.getLogger("eie.responses")


class ResponsesRoutes:
    def __init__(self, config: Config, manager: ModelManager, store: ResponseStore):
        self.config = config
        self.manager = manager
        self.store = store
        self.groups: GroupChat | None = None  # a chain or fanout group asked as a model (set by the app)
        self.conversations: ConversationStore | None = None  # the conversation objects (set by the app)
        # background responses; the app's counts their work as requests in flight
        self.background = BackgroundResponses(contextlib.nullcontext)

    # ---- POST /v1/responses ----------------------------------------------------------------

    async def create(self, request: Request) -> None:
        with errors_renamed(responses_input.renamed):
            await self._create(request)

    async def _create(self, request: Request) -> None:
        req: ResponsesRequest = decoded(_decoder, await request.body(self.config.server.limits.max_body_bytes))
        owner = context.key_id()
        items, conversation_id, turns, history = self._history(req, owner)
        chat = responses_input.chat_request(req, history.messages)
        cut = 0
        base = Response(
            id=responses_input.new_id("resp"), created_at=int(time.time()), status="in_progress",
            instructions=req.instructions, max_output_tokens=req.max_output_tokens, model=req.model,
            parallel_tool_calls=req.parallel_tool_calls, previous_response_id=req.previous_response_id,
            reasoning=req.reasoning or ReasoningConfig(), store=req.store, temperature=req.temperature,
            text=req.text or TextConfig(), tool_choice=req.tool_choice or "auto", tools=req.tools or [],
            top_p=req.top_p, top_logprobs=req.top_logprobs or 0, user=req.user, metadata=req.metadata or {},
            background=bool(req.background), truncation=req.truncation or "disabled",
            conversation=ConversationRef(conversation_id) if conversation_id is not None else None,
        )
        added = False

        def keep(response: Response, events: list[bytes] | None = None) -> None:
            nonlocal added
            if req.store:  # (before the client hears of it: a GET may follow at once)
                self._store(response, items, turns + [_assistant_turn(response)], owner, events, cut)
            if conversation_id is not None and response.status in ("completed", "incomplete") and not added:
                added = True
                self._add_to_conversation(conversation_id, owner, items, response,
                                          history.item_at(cut) if req.truncation == "auto" else None)

        group = self.config.group(req.model)  # a group may not share a model's name (config.py)
        groups = self.groups if group is not None else None
        if groups is not None:  # a chain or fanout group asked as a model
            if req.truncation == "auto":
                raise bad_request("truncation auto cuts a model's conversation to its context; a group's "
                                  "members each have their own: leave it out", param="truncation")
            async def answer(to: Request, writer: ResponseEvents) -> None:
                await groups.relay_answer(to, chat, group, lambda _: writer, req.stream)
        else:
            # the model, the prompt and the request's fields are checked before a background response starts
            runner = await generation_runner(self.manager, req.model,
                                             sse=request if req.stream else None)
            if req.truncation == "auto":
                cut = await self._cut(runner, req, history.messages, history.floor)
                chat = responses_input.chat_request(req, truncation.kept(history.messages, cut))
            prompt, params, shape = await chat_answer_plan(runner, chat)
            if req.background:  # a prompt that does not fit is a 400 now (relay_chat finds it in the foreground)
                chat_max_tokens(self.config, runner, chat, prompt, "input")

            async def answer(to: Request, writer: ResponseEvents) -> None:
                await relay_chat(to, self.config, runner, chat, prompt, params, shape, writer, req.stream, "input")
        if req.background:
            if self.store.max_entries == 0:
                raise bad_request("a background response is read from the stored responses, and this server "
                                  "keeps none (server.responses.max_entries is 0)", param="background")
            queued = msgspec.structs.replace(base, status="queued")
            events = self.background.start(request, queued, bool(chat.logprobs), keep, answer,
                                           responses_input.renamed, bool(req.stream))
            if events is None:
                await request.json(200, queued)
            else:  # its client may go away: the response goes on, and its events can be read again
                await _relay(request, events, -1)
            return
        await answer(request, ResponseEvents(base, bool(chat.logprobs), keep))

    async def input_tokens(self, request: Request) -> None:
        """POST /v1/responses/input_tokens: the prompt tokens a response to this request would
        have (its conversation or previous responses, instructions, tools, `truncation: auto`)."""
        with errors_renamed(responses_input.renamed):
            req: InputTokensRequest = decoded(_count_decoder,
                                              await request.body(self.config.server.limits.max_body_bytes))
            if self.config.group(req.model) is not None:
                raise bad_request("a group's members each count their own prompt: name a model", param="model")
            _, _, _, history = self._history(req, context.key_id())
            runner = await generation_runner(self.manager, req.model)
            cut = await self._cut(runner, req, history.messages, history.floor) if req.truncation == "auto" else 0
            prompt, _ = await chat_prompt(runner, responses_input.chat_request(req, truncation.kept(history.messages,
                                                                                                   cut)))
        await request.json(200, InputTokenCount(len(prompt)))

    def _history(self, req: ResponsesRequest, owner: str | None
                 ) -> tuple[list[dict[str, Any]], str | None, list[ChatMessage], _History]:
        """The request's input items, its conversation's id, its turns, and the whole history its
        prompt is made of (a conversation's items or the previous responses' turns, then them)."""
        items = responses_input.items(req.input)
        conversation_id = _conversation_id(req)
        turns = responses_input.messages(items)
        history = (self._in_conversation(conversation_id, owner, items) if conversation_id is not None
                   else self._after_previous(req, owner, turns))
        return items, conversation_id, turns, history

    def _after_previous(self, req: ResponsesRequest, owner: str | None, turns: list[ChatMessage]) -> _History:
        """The conversation up to `previous_response_id`'s answer, then this input (`turns`)."""
        if req.previous_response_id is None:
            return _History(turns, 0)
        try:
            previous = self.store.get(req.previous_response_id, owner)
            if previous.response.status in UNFINISHED:
                raise ApiError(400, f"previous response {req.previous_response_id!r} is still in progress (a "
                               "background response: continue it once it has finished)",
                               param="previous_response_id", code="previous_response_in_progress")
            earlier = self.store.conversation(req.previous_response_id, owner)
        except MissingRecord as e:
            raise ApiError(400, f"previous response {e.record_id!r} is {e.why}", param="previous_response_id",
                           code="previous_response_not_found") from None
        return _History(earlier + turns, previous.truncated)

    def _store(self, response: Response, items: list[dict[str, Any]], turns: list[ChatMessage], owner: str | None,
               events: list[bytes] | None, cut: int) -> None:
        """Keep a state of a response. One larger than server.responses.max_mb is kept without its
        stream's events (a replay then has none), else not at all, and no earlier state of it
        stays (a background response's in_progress one would stay so for good)."""
        if self.store.put(response, items, turns, owner, events, cut):
            return
        if events is not None and self.store.put(response, items, turns, owner, None, cut):
            log.warning("response %s: its stream's events are larger than server.responses.max_mb: kept without them",
                        response.id)
            return
        log.warning("response %s (%s) is larger than server.responses.max_mb: not kept", response.id, response.status)
        try:
            self.store.delete(response.id, owner)
        except MissingRecord:
            pass

    def _in_conversation(self, conversation_id: str, owner: str | None, items: list[dict[str, Any]]) -> _History:
        """A conversation object's items, then this input."""
        if self.conversations is None:
            raise bad_request("this server keeps no conversations", param="conversation")
        try:
            record = self.conversations.get(conversation_id, owner)
        except MissingRecord as e:
            raise not_found("conversation", e, "conversation") from None
        responses_input.check_new_ids(items, record.items, "input")
        every = record.items + items
        messages, sources = responses_input.messages_and_sources(every)
        ids = [every[i]["id"] for i in sources]  # each message's first item
        floor = ids.index(record.cut) if record.cut in ids else 0
        return _History(messages, floor, ids)

    def _add_to_conversation(self, conversation_id: str, owner: str | None, items: list[dict[str, Any]],
                             response: Response, cut: str | None) -> None:
        """A response's input and output items join its conversation once it has ended."""
        output = [msgspec.to_builtins(item) for item in response.output]
        try:
            self.conversations.extend(conversation_id, owner, items + output, cut)
        except MissingRecord:  # deleted while the response was made
            log.info("response %s ended after its conversation %s was deleted", response.id, conversation_id)

    async def _cut(self, runner: ModelRunner, req: ResponsesRequest, conversation: list[ChatMessage],
                   floor: int) -> int:
        """Where `truncation: auto` cuts the conversation: at the previous response's cut while
        the prompt fits (responses_truncation.py)."""
        sizes: dict[int, int] = {}

        async def size(cut: int) -> int:
            if cut not in sizes:
                prompt, _ = await chat_prompt(runner, responses_input.chat_request(
                    req, truncation.kept(conversation, cut)))
                sizes[cut] = len(prompt)
            return sizes[cut]

        room = truncation.prompt_room(self.config, runner, req.max_output_tokens)
        return await truncation.choose_cut(truncation.turn_starts(conversation, floor), size, room)

    # ---- the stored responses --------------------------------------------------------------

    def _stored(self, request: Request):
        try:
            return self.store.get(request.path_params["response_id"], context.key_id())
        except MissingRecord as e:
            raise not_found("response", e) from None

    async def retrieve(self, request: Request) -> None:
        """The stored response, or with `stream=true` its events (a background response asked
        with `stream`), after the sequence number `starting_after` where it is given."""
        stream = request.query("stream")
        if stream not in (None, "true", "false"):
            raise bad_request("stream must be true or false", param="stream")
        record = self._stored(request)
        if stream != "true":
            await request.json(200, record.response)
            return
        after = request.query("starting_after")
        if after is not None and not (after.isascii() and after.isdigit()):
            raise bad_request("starting_after must be a sequence number (an integer from 0)", param="starting_after")
        starting_after = int(after) if after is not None else -1
        events = self.background.log(record.response.id)
        if events is None and record.events is not None:
            events = EventLog(record.events, done=True)
        if events is None:
            response = record.response
            restarted = response.error is not None and response.error.code == "server_restarted"
            why = ("it was not made in the background" if not response.background
                   else "the server restarted before it finished" if restarted
                   else "it was made without stream")
            raise bad_request(f"response {record.response.id!r} has no events to stream: {why}", param="stream")
        await _relay(request, events, starting_after)

    async def delete(self, request: Request) -> None:
        response_id = request.path_params["response_id"]
        if self._stored(request).response.status in UNFINISHED:
            await self.background.cancel(response_id)  # else its end would store it again
        try:
            self.store.delete(response_id, context.key_id())
        except MissingRecord as e:
            raise not_found("response", e) from None
        await request.json(200, DeletedResponse(response_id))

    async def cancel(self, request: Request) -> None:
        """Stop a background response (its state becomes cancelled); one that has finished comes
        back as it is."""
        record = self._stored(request)
        if not record.response.background:
            raise bad_request("only a background response can be cancelled", param="response_id")
        if record.response.status in UNFINISHED:
            await self.background.cancel(record.response.id)
        await request.json(200, self._stored(request).response)

    async def input_items(self, request: Request) -> None:
        """The input items, a page at a time (item_page)."""
        await request.json(200, item_page(self._stored(request).input_items, request, "this response"))


@dataclass(frozen=True)
class _History:
    """What a response is asked over: the earlier turns and its input, as chat messages."""

    messages: list[ChatMessage]
    floor: int  # where the prompt before it started (`truncation: auto` cuts there again while it fits)
    ids: list[str] | None = None  # in a conversation object: each message's first item, which names a cut

    def item_at(self, cut: int) -> str | None:
        return self.ids[cut] if self.ids is not None and cut < len(self.ids) else None


def _conversation_id(req: ResponsesRequest) -> str | None:
    """The conversation the request is made in (`conversation`: an id, or {"id": ...})."""
    value = req.conversation
    if isinstance(value, dict):
        value = value.get("id")
    if req.conversation is not None and (not isinstance(value, str) or not value):
        raise bad_request("conversation must be a conversation id or {\"id\": ...}", param="conversation")
    if value is not None and req.previous_response_id is not None:
        raise bad_request("a response continues a conversation or a previous response, not both: leave "
                          "previous_response_id out", param="conversation")
    return value


async def _relay(request: Request, events: EventLog, after: int) -> None:
    """Stream a background response's events after sequence number `after`, as they come, until
    it ends or the client goes away (the response goes on)."""
    sse = EventStream(request)
    try:
        async for event in events.follow(after):
            await sse.raw(event)
        await sse.close()
    except OSError:
        pass


def _assistant_turn(response: Response) -> ChatMessage:
    """The answer as the assistant's chat message, for a later response that continues it."""
    text = "".join(part.text for item in response.output if isinstance(item, MessageItem) for part in item.content)
    calls = [ToolCall(id=item.call_id, function=FunctionCall(item.name, item.arguments))
             for item in response.output if isinstance(item, FunctionCallItem)]
    return ChatMessage("assistant", text or (None if calls else ""), tool_calls=calls or None)
