"""Health, memory and scheduling status, and the model admin endpoints."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

import msgspec

from ..config import Config, KvType
from ..engine import native
from ..engine.adapters import BASE
from ..engine.client import PromptError, render_chat
from ..engine.context_swap import MigrationReverted
from ..engine.runner import NotReady, QueueFull
from ..engine.manager import InsufficientMemory, ModelBusy, ModelManager, PolicyRefused, shape_of
from ..policy import PluginError
from ..resources import memory
from ..resources.estimate import estimate
from .errors import ApiError, bad_request, decoded
from .generation import manager_error
from .http import Request
from .probes import run_probe

UNQUANTIZED = ("f32", "f16", "bf16")  # V cache types llama.cpp takes without flash attention


class ModelAction(msgspec.Struct, frozen=True):
    model: str


_action = msgspec.json.Decoder(ModelAction)


class KvConvert(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: str
    mode: KvType  # the V type (and K's, unless `k` is given)
    k: KvType | None = None


_kv_convert = msgspec.json.Decoder(KvConvert)


class WarmMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    role: str
    content: str


class KvWarm(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: str
    prompt: str | None = None  # raw text, as /v1/completions takes it
    messages: list[WarmMessage] | None = None  # or chat messages, rendered with the model's template


class KvFlush(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: str | None = None  # None: every model


_kv_warm = msgspec.json.Decoder(KvWarm)
_kv_flush = msgspec.json.Decoder(KvFlush)


def _not_loaded(name: str, why: Exception) -> ApiError:
    """409 for a model whose runner unloaded before it ran what the call asked of it."""
    return ApiError(409, f"model '{name}' is not loaded: {why}", param="model", code="model_not_loaded")


class AdminRoutes:
    def __init__(self, config: Config, manager: ModelManager):
        self.config = config
        self.manager = manager
        self.draining: Callable[[], bool] = lambda: False

    async def health(self, request: Request) -> None:
        states = self.manager.states()
        boot = set(self.manager.boot_models())
        models = {name: {"state": s, **({"error": e} if e else {})} for name, (s, e) in states.items()}
        watched = [s for name, (s, _) in states.items() if name in boot]
        if self.draining():
            status, code = "draining", 503
        elif any(s == "loading" for s in watched):
            status, code = "loading", 503
        elif all(s == "ready" for s in watched) and not any(s == "failed" for s, _ in states.values()):
            status, code = "ok", 200
        else:
            status, code = "degraded", 503
        await request.json(code, {"status": status, "strategy": self.manager.policy.name, "models": models})

    async def vram_status(self, request: Request) -> None:
        devices = [
            {"device": d.device, "kind": d.kind, "total_bytes": d.total_bytes, "used_bytes": d.used_bytes,
             "free_bytes": d.free_bytes, "source": d.source}
            for d in await run_probe(memory.devices)  # NVML/CUDA probes stay off the loop
        ]
        # an estimate not made yet reads the GGUF header (a vocab-only load, seconds): off the loop too
        models, budgets = await run_probe(self._memory_by_model)
        proc = memory.process_memory()
        await request.json(200, {"devices": devices, "budgets": budgets, "models": models,
                                 "process": {"rss_bytes": proc.rss_bytes, "anonymous_bytes": proc.anonymous_bytes,
                                             "file_bytes": proc.file_bytes, "shared_bytes": proc.shared_bytes,
                                             "source": proc.source},
                                 "watermarks": {"low_percent": self.config.vram.low_watermark,
                                                "critical_percent": self.config.vram.critical_watermark,
                                                "reserve_mb": self.config.vram.reserve_mb}})

    def _memory_by_model(self) -> tuple[list[dict], dict[str, dict]]:
        """Each model's memory (measured, estimated, KV) and each budget's use, for vram_status."""
        models: list[dict] = []
        budgets: dict[str, dict] = {}
        for name, r in list(self.manager.runners.items()):
            loaded = r.loaded  # (once: an unload meanwhile leaves this one's numbers)
            b = loaded.buffers if loaded else None
            est = self.manager.estimate_for(name)
            budget = self.manager.budget(name)
            budgets[budget.scope] = {
                "capacity_bytes": budget.capacity, "used_bytes": self.manager.used(budget),
                "low_watermark_bytes": budget.low, "critical_watermark_bytes": budget.critical,
            }
            models.append({
                "name": name,
                "state": r.state,
                "device": self.manager.gpu if self.manager.gpu and r.gpu_layers != 0 else "cpu",
                "gpu_layers": self.manager.gpu_layers(name),
                "budget": budget.scope,
                "weights_bytes": b.weights if b else 0,
                "kv_cache_bytes": b.kv if b else 0,
                "compute_bytes": (b.compute + b.output) if b else 0,
                "draft_model_bytes": self.manager.draft_measured(r),
                "lora_adapter_bytes": r.adapter_bytes,
                "total_bytes": self.manager.measured(r),
                "gpu_memory_bytes": b.device if b else 0,
                "host_memory_bytes": (b.total - b.device) if b else 0,
                "estimate": {"weights_bytes": est.weights, "kv_cache_bytes": est.kv, "compute_bytes": est.compute,
                             "draft_model_bytes": est.draft_model, "lora_adapter_bytes": est.lora_adapters,
                             "total_bytes": est.total,
                             "gpu_memory_bytes": self.manager.estimated_gpu_bytes(name)} if est else None,
                "kv_type_k": r.kv_types[0],
                "kv_type_v": r.kv_types[1],
                **self.manager.kv_status(name),
                "n_ctx": r.cfg.n_ctx,
                "n_parallel": r.cfg.n_parallel,
                "n_ctx_total": loaded.n_ctx_total if loaded else 0,
            })
        return models, budgets

    async def scheduling_status(self, request: Request) -> None:
        models = {
            name: {"state": r.state, "pinned": self.manager.policy.pinned(name), "n_parallel": r.cfg.n_parallel,
                   "running": r.running(), "queued": r.queue_depth(), "max_queue": r.cfg.max_queue,
                   "background": r.background_counts(),
                   "threads": r.threads, **r.stats, "speculative": r.speculative_stats()}
            for name, r in self.manager.runners.items()
        }
        groups = [
            {"name": g.name, "type": g.type, "models": g.models, "pinned": g.pinned,
             "resident": all(self.manager.runners[self.config.base_of(m)].state == "ready" for m in g.models),
             "fallback": g.fallback if isinstance(g.fallback, str) else {"replace_with": g.fallback.replace_with},
             **({"select": g.select, "samples": g.samples} if g.type == "fanout" else {})}
            for g in self.config.groups
        ]
        await request.json(200, {
            "strategy": self.manager.policy.name,
            "cores": {"total": self.manager.cores.total, "busy": self.manager.cores.busy},
            "models": models,
            "groups": groups,
            "counters": dict(self.manager.counters),
            "events": list(self.manager.events),
        })

    async def _model_action(self, request: Request) -> str:
        action = decoded(_action, await request.body(self.config.server.limits.max_body_bytes))
        if action.model not in self.manager.runners:
            raise ApiError(404, f"model '{action.model}' is not configured", param="model", code="model_not_found")
        return action.model

    async def load(self, request: Request) -> None:
        name = await self._model_action(request)
        try:
            runner = await self.manager.load_async(name)
        except (PolicyRefused, InsufficientMemory, PluginError) as e:
            raise manager_error(e) from None
        if runner.state != "ready":  # (its file, mostly): the error envelope, as a request to it gets
            raise ApiError(503, f"model '{name}' failed to load: {runner.error}", type="service_unavailable",
                           param="model", code="load_failed")
        await request.json(200, {"model": name, "state": runner.state, "error": None,
                                 "total_bytes": self.manager.measured(runner)})

    async def unload(self, request: Request) -> None:
        name = await self._model_action(request)
        try:
            await asyncio.to_thread(self.manager.unload, name)
        except (PolicyRefused, ModelBusy) as e:
            raise manager_error(e) from None
        await request.json(200, {"model": name, "state": self.manager.runners[name].state})

    async def kv_convert(self, request: Request) -> None:
        """Move a loaded model's KV cache to other types now (live migration, no reload)."""
        req = decoded(_kv_convert, await request.body(self.config.server.limits.max_body_bytes))
        runner = self.manager.runners.get(req.model)
        if runner is None:
            raise ApiError(404, f"model '{req.model}' is not configured", param="model", code="model_not_found")
        if runner.state != "ready":
            raise ApiError(409, f"model '{req.model}' is {runner.state}, not loaded", param="model",
                           code="model_not_loaded")
        if runner.cfg.flash_attn == "off" and req.mode not in UNQUANTIZED:
            # known before the context is torn down: llama.cpp refuses a quantized V without it
            raise bad_request(f"model '{req.model}' has flash_attn: off, and a quantized V cache ({req.mode}) needs "
                              "flash attention; quantize K alone (k) and keep mode f16", param="mode")
        # off the loop: change_kv takes the manager's lock, which a load or an eviction can hold for seconds
        fut = await asyncio.to_thread(self.manager.change_kv, req.model, req.k or req.mode, req.mode,
                                      "requested through the admin API")
        try:
            record = await asyncio.wait_for(asyncio.wrap_future(fut), timeout=120)
        except native.LoadError as e:
            raise ApiError(400, str(e), param="mode", code="kv_type_unavailable") from None
        except NotReady as e:  # unloaded before its runner got to it
            raise _not_loaded(req.model, e) from None
        except TimeoutError:
            raise ApiError(504, "the KV migration did not finish in 120 s", code="timeout") from None
        except MigrationReverted as e:  # the new context could not be made (memory, mostly)
            raise ApiError(503, str(e), type="server_error", code="kv_migration_reverted") from None
        except Exception as e:
            if runner.state == "failed":  # neither the new context nor the old one could be made
                raise ApiError(500, f"KV migration failed and the model has no context left: {e}",
                               type="server_error", code="model_failed") from None
            raise ApiError(500, f"KV migration failed, the model keeps its types: {e}", type="server_error",
                           code="kv_migration_failed") from None
        await request.json(200, {"model": req.model, **record})

    def _prefix_runner(self, name: str):
        runner = self.manager.runners.get(name)
        if runner is None:
            raise ApiError(404, f"model '{name}' is not configured", param="model", code="model_not_found")
        if runner.state != "ready":
            raise ApiError(409, f"model '{name}' is {runner.state}, not loaded", param="model", code="model_not_loaded")
        if runner.prefix is None:
            raise ApiError(409, f"the prefix cache is off for model '{name}'", param="model", code="prefix_cache_off")
        return runner

    async def kv_warm(self, request: Request) -> None:
        """Prefill a prefix (e.g. a system prompt) and save it in the prefix cache."""
        req = decoded(_kv_warm, await request.body(self.config.server.limits.max_body_bytes))
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "give exactly one of prompt and messages", param="prompt")
        # a LoRA adapter's name: its model, with the adapter
        base, adapters = self.manager.adapter_target(req.model) or (req.model, BASE)
        runner = self._prefix_runner(base)
        try:
            if req.messages is not None:
                msgs = [{"role": m.role, "content": m.content} for m in req.messages]
                tokens = await asyncio.to_thread(render_chat, runner, msgs)
            else:
                tokens = await asyncio.to_thread(runner.vocab.tokenize, req.prompt, add_special=True,
                                                 parse_special=False)
        except PromptError as e:
            raise ApiError(400, str(e), param=e.param) from None
        if not 1 < len(tokens) < runner.n_ctx:
            raise ApiError(400, f"the prefix has {len(tokens)} tokens; it must have 2 to {runner.n_ctx - 1}",
                           param="prompt" if req.prompt is not None else "messages")
        try:
            fut = runner.warm(tokens, adapters)
        except QueueFull:
            raise ApiError(429, f"model '{req.model}' is busy", code="queue_full") from None
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(fut), timeout=self.config.policy.load_timeout_s)
        except TimeoutError:
            raise ApiError(504, "warming the prefix did not finish in time", code="timeout") from None
        except NotReady as e:
            raise _not_loaded(req.model, e) from None
        except Exception as e:
            raise ApiError(500, f"warming failed: {e}", type="server_error", code="warm_failed") from None
        await asyncio.to_thread(runner.prefix.store.drain, 30)  # writes now wait for a quiet box: off the event loop
        await request.json(200, {"model": req.model, **result, "block_tokens": runner.prefix.block})

    async def kv_status(self, request: Request) -> None:
        models = {}
        for name, r in self.manager.runners.items():
            entry = {"state": r.state, "enabled": r.prefix is not None}
            if r.prefix_error is not None:
                entry["error"] = r.prefix_error  # why a configured cache is off
            if r.prefix is not None:
                entry.update(r.prefix.store.status())
                entry["live_hits"] = r.stats["prefix_live_hits"]
                entry["tokens_restored"] = r.stats["prefix_tokens_restored"]
            models[name] = entry
        await request.json(200, {"models": models})

    async def kv_flush(self, request: Request) -> None:
        req = decoded(_kv_flush, await request.body(self.config.server.limits.max_body_bytes) or b"{}")
        names = [req.model] if req.model else [n for n, r in self.manager.runners.items() if r.prefix is not None]
        flushed = []
        for name in names:
            # without a model: every loaded model with a cache; one unloaded before its turn or
            # during its flush (an eviction, keep_alive) holds nothing in RAM and is skipped
            if not req.model and self.manager.runners[name].state != "ready":
                continue
            runner = self._prefix_runner(name)
            try:
                await asyncio.wrap_future(runner.flush_prefix_cache())
            except NotReady as e:
                if req.model:
                    raise _not_loaded(name, e) from None
                continue
            flushed.append(name)
        await request.json(200, {"flushed": flushed})

    async def discover(self, request: Request) -> None:
        """GGUF files in model_dir (only inside it), with what loading each would take."""
        base = self.config.model_base()
        sub = request.query("path") or "."
        try:
            target = (base / sub).resolve()
            inside, is_dir = target.is_relative_to(base), target.is_dir()
        except (ValueError, OSError) as e:  # a NUL byte, a name past the file system's length
            raise ApiError(400, f"path {sub[:100]!r} is not a directory name: {e}", param="path") from None
        if not inside:
            raise ApiError(400, f"path {sub!r} is outside model_dir", param="path", code="path_outside_model_dir")
        if not is_dir:
            raise ApiError(404, f"no directory {sub!r} in model_dir", param="path", code="not_found")
        names: dict[Path, list[str]] = {}  # a file may be configured under several names
        for m in self.config.models:
            names.setdefault(self.config.model_path(m), []).append(m.name)
        configured = {path: listed[0] for path, listed in names.items()}

        def files() -> list[tuple[Path, int]]:  # (a walk of a large tree: off the event loop)
            out = []
            for path in sorted(target.rglob("*.gguf")):
                try:
                    real = path.resolve()
                    if real.is_relative_to(base) and real.is_file():  # a link out of model_dir is not offered
                        out.append((real, real.stat().st_size))
                except OSError:
                    continue  # gone meanwhile, or unreadable
            return out

        found = []
        for real, size in await asyncio.to_thread(files):
            entry = {"path": str(real.relative_to(base)), "size_bytes": size,
                     "configured_as": configured.get(real), "configured_names": names.get(real, [])}
            try:
                shape = await asyncio.to_thread(shape_of, real)
                entry.update(architecture=shape.architecture, n_layer=shape.n_layer, n_vocab=shape.n_vocab)
                runner = self.manager.runners.get(configured[real]) if real in configured else None
                cfg = runner.cfg if runner else None  # KV types resolved (mode auto)
                if cfg is not None:
                    entry["estimate_bytes"] = estimate(shape, cfg).total
            except (OSError, ValueError) as e:
                entry["error"] = str(e)
            found.append(entry)
        await request.json(200, {"model_dir": str(base), "models": found})

