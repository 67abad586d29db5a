"""POST /tokenize and /detokenize: a model's tokens for a text or a chat, and the text of tokens.

llama-server has both (without `model`: it serves one); here the model is named and loaded on
demand like a completion's. Text is tokenized as a /v1/completions prompt is (BOS added where
the model's tokenizer adds one), messages as /v1/chat/completions renders them, so `count` is
the request's `prompt_tokens`."""

from __future__ import annotations

import asyncio

import msgspec

from ..config import Config
from ..engine.client import PromptError
from ..engine.manager import ModelManager
from .errors import bad_request, decoded
from .generation import chat_prompt, resolve_runner
from .http import Request
from .schemas import ChatRequest, DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse, TokenPiece

_tokenize_decoder = msgspec.json.Decoder(TokenizeRequest)
_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)



def _shown(piece: bytes) -> str | list[int]:
    """A token's piece as llama-server shows it: its text, or its byte values where they are not
    valid UTF-8 alone (part of a character that the next tokens end)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)

class TokenRoutes:
    def __init__(self, config: Config, manager: ModelManager):
        self.config = config
        self.manager = manager

    async def tokenize(self, request: Request) -> None:
        req: TokenizeRequest = decoded(_tokenize_decoder, await request.body(self.config.server.limits.max_body_bytes))
        if (req.content is None) == (req.messages is None):
            raise bad_request("give exactly one of content and messages", param="content")
        runner = await resolve_runner(self.manager, req.model)
        for field in ("tools", "chat_template_kwargs"):
            if getattr(req, field) is not None and req.messages is None:
                raise bad_request(f"{field} goes with messages", param=field)
        if req.messages is not None:
            chat = ChatRequest(model=req.model, messages=req.messages, tools=req.tools, tool_choice=req.tool_choice,
                               parallel_tool_calls=req.parallel_tool_calls, chat_template_kwargs=req.chat_template_kwargs)
            try:
                tokens, _ = await chat_prompt(runner, chat)
            except PromptError as e:
                raise bad_request(str(e), param=e.param) from None
        else:
            tokens = await asyncio.to_thread(runner.vocab.tokenize, req.content, add_special=req.add_special,
                                             parse_special=req.parse_special)
        out: list[int | TokenPiece] = list(tokens)
        if req.with_pieces:
            vocab = runner.vocab
            out = [TokenPiece(t, _shown(vocab.piece(t, special=True))) for t in tokens]
        await request.json(200, TokenizeResponse(req.model, out, len(tokens), runner.n_ctx))

    async def detokenize(self, request: Request) -> None:
        req: DetokenizeRequest = decoded(_detokenize_decoder,
                                         await request.body(self.config.server.limits.max_body_bytes))
        runner = await resolve_runner(self.manager, req.model)
        n_vocab = runner.vocab.n_vocab
        for i, t in enumerate(req.tokens):
            if not 0 <= t < n_vocab:
                raise bad_request(f"token id {t} is outside the vocabulary (0..{n_vocab - 1})", param=f"tokens[{i}]")
        content = await asyncio.to_thread(runner.vocab.text, req.tokens, True)  # special tokens written out
        await request.json(200, DetokenizeResponse(req.model, content))
