"""Ollama's API, so that clients written for Ollama (Home Assistant, Open WebUI, the ollama
libraries) run against the appliance unchanged: /api/chat, /api/generate, /api/embed,
/api/embeddings, /api/tags, /api/ps, /api/show, /api/version.

Generation is asked as a chat request would ask it (api/ollama_input.py) and streamed as
newline-delimited JSON. The model set is the config's: pulling, pushing, creating, copying and
deleting models are refused, and load-time options are left to the config. keep_alive holds
where the strategy loads on demand and may unload the model (engine/manager.py ask_keep_alive)."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import numpy as np

from .. import __version__
from ..config import Config, GroupConfig
from ..engine import gguf_header, reasoning
from ..engine.manager import ModelBusy, ModelManager, PolicyRefused
from ..engine.prefix import file_sha256
from ..engine.runner import ModelRunner
from ..observability import context
from ..resources import file_facts
from . import ollama_input
from .answer_relay import NDJSON, json_line, relay_chat
from .chat_answer import AnswerShape
from .embedding_routes import EmbeddingRoutes, normalised
from .group_chat import GroupChat
from .errors import ApiError, bad_request, decoded, with_param_renamed
from .generation import (
    chat_answer_plan,
    errors_renamed,
    generation_runner,
    manager_error,
    request_sampling,
)
from .infill import infill_prompt
from .http import Request
from .ollama_output import OllamaEvents, now
from .ollama_schemas import (
    OllamaEmbeddings,
    OllamaLegacyEmbedding,
    OllamaListedModel,
    OllamaModelDetails,
    OllamaModelList,
    OllamaAnswer,
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaReply,
    OllamaModelRequest,
    OllamaRunningList,
    OllamaRunningModel,
    OllamaShownModel,
    OllamaVersion,
)

# Not strict: Ollama reads its options' numbers as float64, so an integer option may come as 5.0
_chat = msgspec.json.Decoder(OllamaChatRequest, strict=False)
_generate = msgspec.json.Decoder(OllamaGenerateRequest, strict=False)
_embed = msgspec.json.Decoder(OllamaEmbedRequest)
_model = msgspec.json.Decoder(OllamaModelRequest)
_metadata: dict[tuple, dict[str, str]] = {}  # per file version: an unloaded model's GGUF metadata


_PROMPT_IS_INPUT = ((re.compile(r"^input(\[0\])?$"), "prompt"),)  # /api/embeddings' one input
NEVER = "9999-12-31T23:59:59Z"  # an expiry that does not come


def _iso(seconds: float) -> str:
    """A time.time() as Ollama writes times; one past what a date can say (a keep_alive of 1e12
    seconds: "forever" as a big number) is NEVER."""
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")
    except (ValueError, OverflowError, OSError):
        return NEVER


def quantization(metadata: dict[str, str]) -> str:
    """The weights' type as Ollama names it (Q4_K_M, F16, ...), from general.file_type."""
    import gguf  # 0.2 s to import: not at start-up

    try:
        name = gguf.LlamaFileType(int(metadata["general.file_type"])).name
    except (KeyError, ValueError):
        return ""
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


class OllamaRoutes:
    def __init__(self, config: Config, manager: ModelManager, embeddings: EmbeddingRoutes,
                 groups: GroupChat | None = None):
        self.config = config
        self.manager = manager
        self.embeddings = embeddings
        self.groups = groups  # a chain or fanout group asked as a model (api/group_chat.py)

    def _name(self, name: str) -> str:
        """A configured model's name; Ollama's clients add the tag `:latest` to untagged names."""
        if name not in self.manager.runners and name.endswith(":latest"):
            return name.removesuffix(":latest")
        return name

    async def _body(self, request: Request, decoder: msgspec.json.Decoder):
        return decoded(decoder, await request.body(self.config.server.limits.max_body_bytes))

    async def _keep_alive(self, name: str, value: object, only_that: bool) -> bool:
        """Take a request's keep_alive for model `name` (manager.ask_keep_alive: where the strategy
        loads on demand and may unload it). `only_that` (no messages or prompt) with keep_alive 0
        is Ollama's way to unload a model now: True when that was asked, and done or due once the
        model's requests finish."""
        seconds = ollama_input.keep_alive_seconds(value)
        if (info := context.info()) is not None:
            info.keep_alive_said = True
        if name not in self.manager.runners:
            return False  # a group, or unknown (the generation route says so)
        if not (only_that and seconds == 0):
            self.manager.ask_keep_alive(name, seconds)
            return False
        try:
            await asyncio.to_thread(self.manager.unload, name)
        except ModelBusy:
            pass  # unloaded once idle
        except PolicyRefused as e:
            raise manager_error(e) from None
        self.manager.ask_keep_alive(name, 0.0)
        return True

    # ---- generation ------------------------------------------------------------------------

    async def chat(self, request: Request) -> None:
        with errors_renamed(ollama_input.renamed):
            req: OllamaChatRequest = await self._body(request, _chat)
            req = msgspec.structs.replace(req, model=self._name(req.model))
            if await self._keep_alive(req.model, req.keep_alive, only_that=not req.messages):
                await request.json(200, OllamaAnswer(model=req.model, created_at=now(), done=True,
                                                     done_reason="unload", message=OllamaReply("assistant", "")))
                return
            group = self.config.group(req.model)  # a group may not share a model's name (config.py)
            if group is not None and self.groups is not None and req.messages:
                await self._group(request, req, group)
                return
            runner = await generation_runner(self.manager, req.model) if group is None else None
            if runner is None or not req.messages:  # Ollama's way to load a model (a group's load at once)
                await request.json(200, OllamaAnswer(model=req.model, created_at=now(), done=True, done_reason="load",
                                                     message=OllamaReply("assistant", "")))
                return
            chat = ollama_input.chat_request(req)
            prompt, params, shape = await chat_answer_plan(runner, chat)
            await self._generate(request, runner, chat, prompt, params, shape, req.stream, chat_answer=True)

    async def _group(self, request: Request, req: OllamaChatRequest, group: GroupConfig) -> None:
        """A group's one answer (api/group_chat.py), live from a strict chain's last member, else at the end."""
        writer = OllamaEvents(req.model, True, False)
        await self.groups.relay_answer(request, ollama_input.chat_request(req), group, lambda _: writer, req.stream,
                                       framing=json_line, content_type=NDJSON)

    async def generate(self, request: Request) -> None:
        with errors_renamed(ollama_input.renamed):
            req: OllamaGenerateRequest = await self._body(request, _generate)
            req = msgspec.structs.replace(req, model=self._name(req.model))
            if await self._keep_alive(req.model, req.keep_alive, only_that=not req.prompt):
                await request.json(200, OllamaAnswer(model=req.model, created_at=now(), response="", done=True,
                                                     done_reason="unload"))
                return
            if (group := self._one_answer_group(req.model)) is not None and req.prompt:
                if req.raw or req.suffix:
                    raise bad_request(f"{'raw' if req.raw else 'suffix'} is per model: it cannot be sent to the "
                                      f"group {group.name!r}", param="raw" if req.raw else "suffix")
                writer = OllamaEvents(req.model, False, False)  # (made now: its durations count from here)
                await self.groups.relay_answer(request, ollama_input.generate_request(req), group,
                                               lambda _: writer, req.stream, framing=json_line, content_type=NDJSON)
                return
            runner = await generation_runner(self.manager, req.model) if group is None else None
            if runner is None or not req.prompt:  # Ollama's way to load a model (a group's: at once)
                await request.json(200, OllamaAnswer(model=req.model, created_at=now(), response="", done=True,
                                                     done_reason="load"))
                return
            if req.raw or req.suffix:  # not through the template
                chat = ollama_input.raw_request(req)
                if req.suffix:  # fill-in-the-middle (api/infill.py): the model's FIM tokens
                    prompt = (await asyncio.to_thread(
                        infill_prompt, runner.vocab, req.prompt, req.suffix, n_ctx=runner.n_ctx,
                        max_tokens=chat.max_completion_tokens or runner.n_ctx // 4, param="suffix")).tokens
                else:
                    prompt = await asyncio.to_thread(runner.vocab.tokenize, req.prompt, add_special=True,
                                                     parse_special=True)
                params = await request_sampling(chat, runner.vocab)
                shape = AnswerShape()
            else:
                chat = ollama_input.generate_request(req)
                prompt, params, shape = await chat_answer_plan(runner, chat)
            await self._generate(request, runner, chat, prompt, params, shape, req.stream, chat_answer=False)

    async def _generate(self, request: Request, runner: ModelRunner, chat, prompt: list[int], params,
                        shape: AnswerShape, stream: bool, chat_answer: bool) -> None:
        # num_predict is Ollama's most tokens to predict, not a demand: past the context's room
        # (or the server's max_tokens) the answer ends there, done_reason "length"
        most = runner.n_ctx - len(prompt)
        if self.config.server.limits.max_tokens is not None:
            most = min(most, self.config.server.limits.max_tokens)
        if chat.max_completion_tokens is not None and most >= 1 and chat.max_completion_tokens > most:
            chat = msgspec.structs.replace(chat, max_completion_tokens=most)
        writer = OllamaEvents(chat.model, chat_answer, bool(chat.logprobs))
        await relay_chat(request, self.config, runner, chat, prompt, params, shape, writer, stream,
                         "messages" if chat_answer else "prompt", framing=json_line, content_type=NDJSON)

    # ---- embeddings ------------------------------------------------------------------------

    async def embed(self, request: Request) -> None:
        req: OllamaEmbedRequest = await self._body(request, _embed)
        t0 = time.monotonic_ns()
        name = self._name(req.model)
        if isinstance(req.input, list) and not all(req.input):
            raise bad_request("input must be a non-empty string or list of non-empty strings", param="input")
        vectors, prompts = await self._embedded(name, req.input, req.keep_alive, req.truncate)
        if req.dimensions is not None:  # Ollama's: the first ones, normalised again (more: as they are)
            vectors = normalised([v[: req.dimensions] for v in vectors])
        await request.json(200, OllamaEmbeddings(model=req.model, embeddings=[v.tolist() for v in vectors],
                                                 total_duration=time.monotonic_ns() - t0, load_duration=0,
                                                 prompt_eval_count=sum(len(p) for p in prompts)))

    async def embeddings_legacy(self, request: Request) -> None:
        """/api/embeddings: one prompt, one vector."""
        req: OllamaEmbedRequest = await self._body(request, _embed)
        with errors_renamed(lambda e: with_param_renamed(e, _PROMPT_IS_INPUT)):
            vectors, _ = await self._embedded(self._name(req.model), req.prompt or "", req.keep_alive, truncate=False)
        await request.json(200, OllamaLegacyEmbedding(vectors[0].tolist() if vectors else []))

    async def _embedded(self, name: str, inputs: str | list[str], keep_alive: object, truncate: bool
                        ) -> tuple[list[np.ndarray], list[list[int]]]:
        """The vectors of `inputs`, with the request's keep_alive taken first; no input is Ollama's
        way to load the model (or, with keep_alive 0, to unload it): no vectors."""
        if await self._keep_alive(name, keep_alive, only_that=not inputs):
            return [], []
        if not inputs:
            await self.embeddings.runner(name)
            return [], []
        return await self.embeddings.vectors(name, inputs, None, truncate=truncate)

    # ---- models ----------------------------------------------------------------------------

    def _metadata(self, runner: ModelRunner) -> dict[str, str]:
        if runner.loaded is not None:
            return runner.loaded.metadata
        try:
            key = file_facts.stat_key(runner.path)
        except OSError:
            return {}
        if key not in _metadata:
            try:
                _metadata[key] = gguf_header.read(runner.path)
            except ValueError:
                _metadata[key] = {}
        return _metadata[key]

    def _facts(self, name: str, runner: ModelRunner) -> tuple[OllamaModelDetails, int, str, str]:
        """(details, file size, digest, modification time) of a configured model (blocking); a
        file that cannot be read (the model failed to load) has size 0 and no digest."""
        path = Path(runner.path)
        meta = self._metadata(runner)
        arch = meta.get("general.architecture", "")
        details = OllamaModelDetails(family=arch, families=[arch] if arch else None,
                                     parameter_size=meta.get("general.size_label", ""),
                                     quantization_level=quantization(meta))
        try:
            st = path.stat()
            return details, st.st_size, file_sha256(path, self.config.cache_dir()), _iso(st.st_mtime)
        except OSError:
            return details, 0, "", _iso(0)

    async def tags(self, request: Request) -> None:
        def listed() -> list[OllamaListedModel]:
            out = []
            for name, runner in self.manager.runners.items():
                details, size, digest, modified = self._facts(name, runner)
                out.append(OllamaListedModel(name=name, model=name, modified_at=modified, size=size, digest=digest,
                                       details=details))
                for adapter in runner.cfg.lora:  # served on the model's weights (models[].lora)
                    out.append(OllamaListedModel(name=adapter.name, model=adapter.name, modified_at=modified,
                                                 size=size, digest=digest, details=details))
            for group in self.config.groups if self.groups is not None else ():
                if group.type != "parallel":  # one answer: /api/chat takes it as a model
                    out.append(OllamaListedModel(name=group.name, model=group.name, modified_at=_iso(0), size=0,
                                                 digest="", details=_group_details(group)))
            return out

        await request.json(200, OllamaModelList(await asyncio.to_thread(listed)))

    async def ps(self, request: Request) -> None:
        def running() -> list[OllamaRunningModel]:
            out = []
            for name, runner in list(self.manager.runners.items()):
                loaded = runner.loaded  # (once: an unload meanwhile leaves this one's numbers)
                if runner.state != "ready" or loaded is None:
                    continue
                details, _, digest, modified = self._facts(name, runner)
                b = loaded.buffers
                at = self.manager.idle_unload_at(name)
                expires = _iso(at) if at is not None else NEVER  # pinned, or kept: never
                out.append(OllamaRunningModel(name=name, model=name, modified_at=modified,
                                              size=self.manager.measured(runner), digest=digest, details=details,
                                              expires_at=expires, size_vram=b.device, context_length=runner.n_ctx))
            return out

        await request.json(200, OllamaRunningList(await asyncio.to_thread(running)))

    def _one_answer_group(self, name: str) -> GroupConfig | None:
        """The group `name` where /api/tags lists it: one that answers once (not parallel)."""
        group = self.config.group(name) if self.groups is not None else None
        return group if group is not None and group.type != "parallel" else None

    async def show(self, request: Request) -> None:
        req: OllamaModelRequest = await self._body(request, _model)
        name = self._name(req.model or req.name or "")
        if (group := self._one_answer_group(name)) is not None:  # (listed by /api/tags: shown too)
            await request.json(200, OllamaShownModel(
                license="", modelfile="", parameters="", template="", details=_group_details(group),
                model_info={"eie.group.type": group.type, "eie.group.models": list(group.models)},
                capabilities=["completion"], modified_at=_iso(0)))
            return
        base = self.manager.config.base_of(name)  # a LoRA adapter shows its model's facts
        runner = self.manager.runners.get(base)
        if runner is None:
            raise ApiError(404, f"model '{name}' does not exist", param="model", code="model_not_found")
        details, _, _, modified = await asyncio.to_thread(self._facts, base, runner)
        meta = await asyncio.to_thread(self._metadata, runner)
        info = {k: _number(v) for k, v in meta.items() if not k.startswith("tokenizer.")}
        if runner.cfg.embedding:
            capabilities = ["embedding"]
        else:
            capabilities = ["completion", "tools"]
            if runner.template is not None and reasoning.applies(runner.template.source, "auto"):
                capabilities.append("thinking")
        template = runner.template.source if runner.template is not None else meta.get("tokenizer.chat_template", "")
        await request.json(200, OllamaShownModel(license=meta.get("general.license", ""), modelfile="", parameters="",
                                           template=template, details=details, model_info=info,
                                           capabilities=capabilities, modified_at=modified))

    async def version(self, request: Request) -> None:
        await request.json(200, OllamaVersion(__version__))

    async def refused(self, request: Request) -> None:
        raise ApiError(400, f"{request.path} is not available: this appliance serves the models its config names "
                            "(models[]); add or remove them there", code="fixed_model_set")


def _group_details(group: GroupConfig) -> OllamaModelDetails:
    return OllamaModelDetails(family="group", families=list(group.models))


def _number(value: str):
    """A metadata value as Ollama's model_info has it: numbers as numbers."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value
