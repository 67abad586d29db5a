"""Anthropic's Messages API: POST /v1/messages (whole or streamed) and POST
/v1/messages/count_tokens, for clients written against Anthropic's SDKs.

A request is asked as a chat request would ask it (api/anthropic_input.py): the same prompt,
sampling, tools and think blocks; only the answer's form (api/anthropic_output.py) and the error
envelope differ."""

from __future__ import annotations

import msgspec

from ..config import Config
from ..engine.manager import ModelManager
from . import anthropic_input
from .answer_relay import relay_chat
from .anthropic_output import MessageEvents
from .anthropic_schemas import MessagesRequest, TokenCount
from .errors import bad_request, decoded
from .group_chat import GroupChat
from .generation import (
    chat_answer_plan,
    chat_prompt,
    errors_renamed,
    generation_runner,
)
from .http import Request

_decoder = msgspec.json.Decoder(MessagesRequest)


class AnthropicRoutes:
    def __init__(self, config: Config, manager: ModelManager):
        self.config = config
        self.manager = manager
        self.groups: GroupChat | None = None  # a chain or fanout group asked as a model (set by the app)

    async def messages(self, request: Request) -> None:
        with errors_renamed(anthropic_input.renamed):
            await self._messages(request)

    async def count_tokens(self, request: Request) -> None:
        with errors_renamed(anthropic_input.renamed):
            req = await self._request(request)
            runner = await generation_runner(self.manager, req.model)
            prompt, _ = await chat_prompt(runner, anthropic_input.chat_request(req))
        await request.json(200, TokenCount(len(prompt)))

    async def _request(self, request: Request) -> MessagesRequest:
        return decoded(_decoder, await request.body(self.config.server.limits.max_body_bytes))

    async def _messages(self, request: Request) -> None:
        req = await self._request(request)
        if req.max_tokens is None:
            raise bad_request("max_tokens is required", param="max_tokens")
        chat = anthropic_input.chat_request(req)
        group = self.config.group(req.model)  # a group may not share a model's name (config.py)
        if group is not None and self.groups is not None:  # a chain or fanout group asked as a model
            await self.groups.relay_answer(request, chat, group, lambda tokens: MessageEvents(req.model, tokens),
                                           req.stream)
            return
        runner = await generation_runner(self.manager, req.model, sse=request if req.stream else None)
        prompt, params, shape = await chat_answer_plan(runner, chat)
        writer = MessageEvents(req.model, len(prompt))
        await relay_chat(request, self.config, runner, chat, prompt, params, shape, writer, req.stream, "messages")
