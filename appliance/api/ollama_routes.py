"""Ollama's API, so that clients written for Ollama (Home Assistant, Open WebUI, the ollama
libraries) run against the appliance unchanged: /api/chat, /api/generate, /api/embed,
/api/embeddings, /api/tags, /api/ps, /api/show, /api/version.

Generation is asked as a chat request would ask it (api/ollama_input.py) and streamed as
newline-delimited JSON. The model set is the config's: pulling, pushing, creating, copying and
deleting models are refused, and load-time options are left to the config. keep_alive holds
where the strategy loads on demand and may unload the model (engine/manager.py ask_keep_alive)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path

import msgspec

from .. import __version__
from ..config import Config, GroupConfig
from ..engine import gguf_header, reasoning
from ..engine.manager import ModelBusy, ModelManager, PolicyRefused
from ..engine.prefix import file_sha256
from ..engine.runner import ModelRunner
from ..resources import file_facts
from . import ollama_input
from .answer_relay import NDJSON, json_line, relay_chat
from .chat_answer import AnswerShape
from .embedding_routes import EmbeddingRoutes
from .group_chat import GroupChat
from .errors import ApiError, bad_request, decoded
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

_chat = msgspec.json.Decoder(OllamaChatRequest)
_generate = msgspec.json.Decoder(OllamaGenerateRequest)
_embed = msgspec.json.Decoder(OllamaEmbedRequest)
_model = msgspec.json.Decoder(OllamaModelRequest)
_metadata: dict[tuple, dict[str, str]] = {}  # per file version: an unloaded model's GGUF metadata


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


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
            runner = await generation_runner(self.manager, req.model)
            if not req.prompt:
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
        writer = OllamaEvents(chat.model, chat_answer, bool(chat.logprobs))
        await relay_chat(request, self.config, runner, chat, prompt, params, shape, writer, stream,
                         "messages" if chat_answer else "prompt", framing=json_line, content_type=NDJSON)

    # ---- embeddings ------------------------------------------------------------------------

    async def embed(self, request: Request) -> None:
        req: OllamaEmbedRequest = await self._body(request, _embed)
        t0 = time.monotonic_ns()
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts or not all(texts):
            raise bad_request("input must be a non-empty string or list of non-empty strings", param="input")
        await self._keep_alive(self._name(req.model), req.keep_alive, only_that=False)
        vectors, prompts = await self.embeddings.vectors(self._name(req.model), req.input, req.dimensions,
                                                         truncate=req.truncate)
        await request.json(200, OllamaEmbeddings(model=req.model, embeddings=[v.tolist() for v in vectors],
                                           total_duration=time.monotonic_ns() - t0, load_duration=0,
                                           prompt_eval_count=sum(len(p) for p in prompts)))

    async def embeddings_legacy(self, request: Request) -> None:
        """/api/embeddings: one prompt, one vector."""
        req: OllamaEmbedRequest = await self._body(request, _embed)
        if not req.prompt:
            raise bad_request("prompt must be a non-empty string", param="prompt")
        vectors, _ = await self.embeddings.vectors(self._name(req.model), [req.prompt], None)
        await request.json(200, OllamaLegacyEmbedding(vectors[0].tolist()))

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
                                                 digest="", details=OllamaModelDetails(family="group",
                                                                                       families=list(group.models))))
            return out

        await request.json(200, OllamaModelList(await asyncio.to_thread(listed)))

    async def ps(self, request: Request) -> None:
        def running() -> list[OllamaRunningModel]:
            out = []
            for name, runner in self.manager.runners.items():
                if runner.state != "ready" or runner.loaded is None:
                    continue
                details, _, digest, modified = self._facts(name, runner)
                b = runner.loaded.buffers
                at = self.manager.idle_unload_at(name)
                expires = _iso(at) if at is not None else "9999-12-31T23:59:59Z"  # pinned, or kept: never
                out.append(OllamaRunningModel(name=name, model=name, modified_at=modified,
                                              size=self.manager.measured(runner), digest=digest, details=details,
                                              expires_at=expires, size_vram=b.device, context_length=runner.n_ctx))
            return out

        await request.json(200, OllamaRunningList(await asyncio.to_thread(running)))

    async def show(self, request: Request) -> None:
        req: OllamaModelRequest = await self._body(request, _model)
        name = self._name(req.model or req.name or "")
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


def _number(value: str):
    """A metadata value as Ollama's model_info has it: numbers as numbers."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value
