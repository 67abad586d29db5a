"""POST /v1/embeddings: OpenAI's embeddings from a model configured with `embedding: true`.

Each input is one sequence of the model's context, pooled by llama.cpp (engine/runner.py
`embed`); inputs are packed into decodes of up to n_batch tokens and n_parallel sequences. The
vectors are L2-normalised, as OpenAI's are, and go out as float lists or base64 of little-endian
float32 (what the OpenAI SDKs ask for by default)."""

from __future__ import annotations

import asyncio
import base64

import msgspec
import numpy as np

from ..config import Config
from ..engine.manager import ModelManager
from ..engine.runner import NotReady
from ..observability import context
from .errors import ApiError, bad_request, decoded
from .generation import RETRY_AFTER, resolve_runner, token_lists
from .http import Request
from .schemas import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage

_decoder = msgspec.json.Decoder(EmbeddingRequest)
MAX_INPUTS = 2048  # OpenAI's limit per request


def normalised(vectors: list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for v in vectors:
        norm = float(np.linalg.norm(v.astype(np.float64)))
        out.append((v / norm).astype(np.float32) if norm > 0 else v.astype(np.float32))
    return out


def encoded(vectors: list[np.ndarray], encoding_format: str) -> list[Embedding]:
    data = []
    for i, v in enumerate(normalised(vectors)):
        value = base64.b64encode(v.astype("<f4").tobytes()).decode() if encoding_format == "base64" else v.tolist()
        data.append(Embedding(i, value))
    return data


class EmbeddingRoutes:
    def __init__(self, config: Config, manager: ModelManager):
        self.config = config
        self.manager = manager
        self._in_flight: dict[str, int] = {}  # per model: requests queued or embedding

    async def embeddings(self, request: Request) -> None:
        req: EmbeddingRequest = decoded(_decoder, await request.body(self.config.server.limits.max_body_bytes))
        runner = await resolve_runner(self.manager, req.model)
        if not runner.cfg.embedding:
            raise bad_request(f"model '{req.model}' is not an embedding model (set models[].embedding: true for one)",
                              param="model")
        if req.dimensions is not None and req.dimensions != runner.embedding_size:
            raise bad_request(f"this model's embeddings have {runner.embedding_size} dimensions; dimensions cannot "
                              "change them", param="dimensions")
        prompts = await asyncio.to_thread(token_lists, runner.vocab, req.input, "input", MAX_INPUTS)
        one = isinstance(req.input, str) or not isinstance(req.input[0], (str, list))  # a single input
        limit = runner.embedding_cap()
        bound = "models[].n_batch" if limit == runner.batch_cap else "the model's training context"
        for i, p in enumerate(prompts):
            where = "input" if one else f"input[{i}]"
            if not p:
                raise bad_request("the input is empty after tokenization", param=where)
            if len(p) > limit:
                raise bad_request(f"the input has {len(p)} tokens; this model embeds at most {limit} ({bound})",
                                  param=where, code="context_length_exceeded")
        cap = runner.cfg.n_parallel + runner.cfg.max_queue
        if self._in_flight.get(req.model, 0) >= cap:
            raise ApiError(429, f"model '{req.model}' has too many requests queued; retry later",
                           type="rate_limit_error", code="queue_full", headers=RETRY_AFTER)
        self._in_flight[req.model] = self._in_flight.get(req.model, 0) + 1
        try:
            fut = runner.embed(prompts)
            try:
                vectors = await asyncio.wait_for(asyncio.wrap_future(fut), self.config.server.limits.request_timeout_s)
            except TimeoutError:
                raise ApiError(504, "the embeddings did not finish in time", type="timeout",
                               code="deadline_exceeded") from None
            except NotReady as e:
                raise ApiError(503, f"model is not ready: {e}", type="service_unavailable",
                               code="model_not_ready") from None
        finally:
            self._in_flight[req.model] -= 1
        data = await asyncio.to_thread(encoded, vectors, req.encoding_format)  # 2048 vectors take a while
        n = sum(len(p) for p in prompts)
        info = context.info()
        if info is not None:
            info.prompt_tokens += n
        await request.json(200, EmbeddingList(data, req.model, EmbeddingUsage(n, n)))
