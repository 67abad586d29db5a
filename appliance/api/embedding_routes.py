"""POST /v1/embeddings and POST /v1/rerank: what a model configured with `embedding: true` pools.

Each input is one sequence of the model's context, pooled by llama.cpp (engine/runner.py
`embed`); inputs are packed into decodes of up to n_batch tokens and n_parallel sequences.
Embeddings are L2-normalised, as OpenAI's are, and go out as float lists or base64 of
little-endian float32 (what the OpenAI SDKs ask for by default). A reranker (pooling rank: a
cross-encoder with a classification head) scores each (query, document) pair, one sequence each,
and answers as Jina, Cohere and llama-server do: the documents by score, highest first."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable

import msgspec
import numpy as np

from ..config import Config
from ..engine.manager import ModelManager
from ..engine.native import Vocab
from ..engine.runner import ModelRunner, NotReady
from ..observability import context
from .errors import ApiError, bad_request, decoded
from .generation import RETRY_AFTER, resolve_runner, token_lists
from .http import Request
from .schemas import (Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage, RerankDocument, RerankRequest,
                      RerankResponse, RerankResult)

_decoder = msgspec.json.Decoder(EmbeddingRequest)
_rerank_decoder = msgspec.json.Decoder(RerankRequest)
MAX_INPUTS = 2048  # OpenAI's limit per request
MAX_DOCUMENTS = 1000  # Cohere's limit per request


def normalised(vectors: list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for v in vectors:
        norm = float(np.linalg.norm(v.astype(np.float64)))
        out.append((v / norm).astype(np.float32) if norm > 0 else v.astype(np.float32))
    return out


def encoded(vectors: list[np.ndarray], encoding_format: str) -> list[Embedding]:
    data = []
    for i, v in enumerate(vectors):
        value = base64.b64encode(v.astype("<f4").tobytes()).decode() if encoding_format == "base64" else v.tolist()
        data.append(Embedding(i, value))
    return data


def refuse_special_text(vocab: Vocab, text: str, param: str) -> None:
    """A query or document filled into a rerank prompt must not read as a special token
    (`<|im_end|>`): it would end the prompt's parts early."""
    if vocab.tokenize(text, add_special=False, parse_special=True) != vocab.tokenize(
            text, add_special=False, parse_special=False):
        raise bad_request("the text contains a special token of this model's rerank prompt", param=param)


def templated_pair(vocab: Vocab, template: str, query: str, document: str) -> list[int]:
    """One reranker input from the GGUF's rerank prompt (`tokenizer.chat_template.rerank`, as
    Qwen3-Reranker's converter writes it): `{query}` and `{document}` replaced, the whole read
    with its special tokens as llama-server reads it (both texts checked by refuse_special_text)."""
    prompt = template.replace("{query}", query).replace("{document}", document)
    return vocab.tokenize(prompt, add_special=False, parse_special=True)


def rerank_pair(vocab: Vocab, query: list[int], document: list[int]) -> list[int]:
    """One cross-encoder input, made as Hugging Face's tokenizers pair two texts, from llama.cpp's
    own flags for a single text: BERT's [CLS] q [SEP] d [SEP], XLM-RoBERTa's <s> q </s></s> d </s>."""
    start = [vocab.bos] if vocab.add_bos and vocab.bos >= 0 else []
    close = [t for t, added in ((vocab.eos, vocab.add_eos), (vocab.sep, vocab.add_sep)) if added and t >= 0]
    return start + query + close + document + close[:1]


def _truncated(prompt: list[int], limit: int, vocab) -> list[int]:
    """`prompt` cut to `limit` tokens at its end, the closing special token (an encoder's SEP or
    EOS, where its tokenizer adds one) kept last."""
    if len(prompt) <= limit:
        return prompt
    closing = prompt[-1] if (vocab.add_eos or vocab.add_sep) and prompt[-1] in (vocab.eos, vocab.sep) else None
    return prompt[:limit - 1] + [closing] if closing is not None else prompt[:limit]


class EmbeddingRoutes:
    def __init__(self, config: Config, manager: ModelManager):
        self.config = config
        self.manager = manager
        self._in_flight: dict[str, int] = {}  # per model: requests queued or embedding

    async def embeddings(self, request: Request) -> None:
        req: EmbeddingRequest = decoded(_decoder, await request.body(self.config.server.limits.max_body_bytes))
        vectors, prompts = await self.vectors(req.model, req.input, req.dimensions)
        data = await asyncio.to_thread(encoded, vectors, req.encoding_format)  # 2048 vectors take a while
        await request.json(200, EmbeddingList(data, req.model, self._usage(prompts)))

    async def vectors(self, model: str, inputs: str | list, dimensions: int | None, truncate: bool = False
                      ) -> tuple[list[np.ndarray], list[list[int]]]:
        """The L2-normalised embeddings of OpenAI's input forms (see token_lists), and the inputs'
        tokens; errors name `input` or `input[i]`. `truncate` (Ollama's): an input longer than the
        model takes loses its end (the special token the tokenizer ends it with kept)."""
        runner = await self._runner(model, rerank=False)
        if dimensions is not None and dimensions != runner.embedding_size:
            raise bad_request(f"this model's embeddings have {runner.embedding_size} dimensions; dimensions cannot "
                              "change them", param="dimensions")
        prompts = await asyncio.to_thread(token_lists, runner.vocab, inputs, "input", MAX_INPUTS)
        one = isinstance(inputs, str) or not isinstance(inputs[0], (str, list))  # a single input
        if truncate:
            prompts = [_truncated(p, runner.embedding_cap, runner.vocab) for p in prompts]
        self._check_lengths(runner, prompts, lambda i: "input" if one else f"input[{i}]")
        vectors = await self._pooled(runner, model, prompts)
        return normalised(vectors), prompts

    async def rerank(self, request: Request) -> None:
        req: RerankRequest = decoded(_rerank_decoder, await request.body(self.config.server.limits.max_body_bytes))
        runner = await self._runner(req.model, rerank=True)
        if not req.documents:
            raise bad_request("documents must not be empty", param="documents")
        if len(req.documents) > MAX_DOCUMENTS:
            raise bad_request(f"at most {MAX_DOCUMENTS} documents per request", param="documents")
        texts = [d if isinstance(d, str) else d.text for d in req.documents]

        def tokenized() -> list[list[int]]:
            query = runner.vocab.tokenize(req.query, add_special=False, parse_special=False)
            if not query:
                raise bad_request("the query is empty after tokenization", param="query")
            if runner.rerank_template is not None:
                refuse_special_text(runner.vocab, req.query, "query")
                for i, t in enumerate(texts):
                    refuse_special_text(runner.vocab, t, f"documents[{i}]")
                return [templated_pair(runner.vocab, runner.rerank_template, req.query, t) for t in texts]
            tokenize = runner.vocab.tokenize
            return [rerank_pair(runner.vocab, query, tokenize(t, add_special=False, parse_special=False)) for t in texts]

        prompts = await asyncio.to_thread(tokenized)
        self._check_lengths(runner, prompts, lambda i: f"documents[{i}]", "the query and document")
        scores = [float(v[0]) for v in await self._pooled(runner, req.model, prompts)]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.top_n]
        results = [RerankResult(i, scores[i], RerankDocument(texts[i]) if req.return_documents else None) for i in order]
        await request.json(200, RerankResponse(req.model, results, self._usage(prompts)))

    async def runner(self, model: str) -> ModelRunner:
        """An embedding model's runner, loaded first where the strategy loads on demand."""
        return await self._runner(model, rerank=False)

    async def _runner(self, model: str, rerank: bool) -> ModelRunner:
        runner = await resolve_runner(self.manager, model)
        if not runner.cfg.embedding:
            raise bad_request(f"model '{model}' is not an embedding model (set models[].embedding: true for one)",
                              param="model")
        if runner.reranker != rerank:
            raise bad_request(f"model '{model}' is a reranker (pooling rank): use /v1/rerank" if runner.reranker else
                              f"model '{model}' is not a reranker: it embeds (/v1/embeddings); a reranker is a "
                              "cross-encoder GGUF with pooling rank", param="model")
        return runner

    @staticmethod
    def _check_lengths(runner: ModelRunner, prompts: list[list[int]], where: Callable[[int], str],
                       what: str = "the input") -> None:
        limit = runner.embedding_cap
        bound = "models[].n_batch" if limit == runner.batch_cap else "the model's training context"
        for i, p in enumerate(prompts):
            if not p:
                raise bad_request(f"{what} is empty after tokenization", param=where(i))
            if len(p) > limit:
                raise bad_request(f"{what} has {len(p)} tokens; this model takes at most {limit} ({bound})",
                                  param=where(i), code="context_length_exceeded")

    async def _pooled(self, runner: ModelRunner, model: str, prompts: list[list[int]]) -> list[np.ndarray]:
        cap = runner.cfg.n_parallel + runner.cfg.max_queue
        if self._in_flight.get(model, 0) >= cap:
            raise ApiError(429, f"model '{model}' has too many requests queued; retry later",
                           type="rate_limit_error", code="queue_full", headers=RETRY_AFTER)
        self._in_flight[model] = self._in_flight.get(model, 0) + 1
        info = context.info()
        if info is not None:
            info.prompt_tokens += sum(len(p) for p in prompts)
        try:
            fut = runner.embed(prompts)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(fut), self.config.server.limits.request_timeout_s)
            except TimeoutError:
                raise ApiError(504, "the embeddings did not finish in time", type="timeout",
                               code="deadline_exceeded") from None
            except NotReady as e:
                raise ApiError(503, f"model is not ready: {e}", type="service_unavailable",
                               code="model_not_ready") from None
        finally:
            self._in_flight[model] -= 1

    @staticmethod
    def _usage(prompts: list[list[int]]) -> EmbeddingUsage:
        n = sum(len(p) for p in prompts)
        return EmbeddingUsage(n, n)

