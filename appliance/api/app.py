"""The ASGI application: routing, auth, the error envelope, lifespan, health and memory status."""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any, Awaitable, Callable

from ..config import Config
from ..engine.manager import ModelManager
from ..resources import memory
from .errors import ApiError
from .http import Receive, Request, Send
from .group_routes import GroupRoutes
from .openai_routes import OpenAIRoutes

log = logging.getLogger("eie.api")

Handler = Callable[[Request], Awaitable[None]]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class App:
    def __init__(self, config: Config, manager: ModelManager):
        self.config = config
        self.manager = manager
        self.openai = OpenAIRoutes(config, manager.runners)
        self.groups = GroupRoutes(config, manager.runners)
        self._key_digests = [_digest(k) for k in config.server.api_keys]
        self.routes: dict[str, dict[str, tuple[Handler, bool]]] = {
            "/v1/chat/completions": {"POST": (self.openai.chat, True)},
            "/v1/completions": {"POST": (self.openai.completions, True)},
            "/v1/models": {"GET": (self.openai.models, True)},
            "/v1/batch/execute": {"POST": (self.groups.batch, True)},
            "/v1/chain/execute": {"POST": (self.groups.chain, True)},
            "/health": {"GET": (self.health, False)},
            "/v1/admin/vram/status": {"GET": (self.vram_status, True)},
            "/v1/admin/scheduling/status": {"GET": (self.scheduling_status, True)},
        }

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive, send)
        try:
            methods = self.routes.get(request.path.rstrip("/") or "/")
            if methods is None:
                raise ApiError(404, f"no such endpoint: {request.method} {request.path}", code="not_found")
            entry = methods.get(request.method)
            if entry is None:
                allow = ", ".join(sorted(methods)).encode()
                raise ApiError(405, f"method {request.method} is not allowed on {request.path}",
                               code="method_not_allowed", headers=[(b"allow", allow)])
            handler, needs_key = entry
            if needs_key:
                self._authorize(request)
            await handler(request)
        except ApiError as e:
            if e.status == 499:
                return  # the client is gone; nobody to answer
            await self._safe_error(request, e)
        except OSError:
            return  # client disconnected while we were answering
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            await self._safe_error(request, ApiError(500, "internal server error", type="server_error"))

    @staticmethod
    async def _safe_error(request: Request, err: ApiError) -> None:
        try:
            await request.error(err)
        except (OSError, RuntimeError):
            pass  # response already started or client gone

    def _authorize(self, request: Request) -> None:
        if not self._key_digests:
            return
        auth = request.header("authorization") or ""
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        # Compare fixed-length digests so the time taken does not depend on how much of a key matched.
        given = _digest(token.strip())
        ok = False
        for d in self._key_digests:
            ok |= hmac.compare_digest(given, d)
        if not ok:
            raise ApiError(401, "invalid API key", code="invalid_api_key")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    self.manager.start()
                except Exception as e:
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                import asyncio

                await asyncio.to_thread(self.manager.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ---- health and memory -----------------------------------------------------------------

    async def health(self, request: Request) -> None:
        states = self.manager.states()
        models = {}
        for name, (state, error) in states.items():
            models[name] = {"state": state, **({"error": error} if error else {})}
        values = [s for s, _ in states.values()]
        if all(s == "ready" for s in values):
            status, code = "ok", 200
        elif any(s == "loading" for s in values):
            status, code = "loading", 503
        else:
            status, code = "degraded", 503
        await request.json(code, {"status": status, "models": models})

    async def scheduling_status(self, request: Request) -> None:
        models = {
            name: {
                "state": r.state,
                "n_parallel": r.cfg.n_parallel,
                "running": r.running(),
                "queued": r.queue_depth(),
                "max_queue": r.cfg.max_queue,
                "threads": r.threads,
                **r.stats,
            }
            for name, r in self.manager.runners.items()
        }
        groups = [
            {"name": g.name, "type": g.type, "models": g.models, "pinned": g.pinned,
             "fallback": g.fallback if isinstance(g.fallback, str) else {"replace_with": g.fallback.replace_with},
             **({"select": g.select, "samples": g.samples} if g.type == "fanout" else {})}
            for g in self.config.groups
        ]
        await request.json(200, {
            "strategy": self.config.policy.strategy,
            "cores": {"total": self.manager.cores.total, "busy": self.manager.cores.busy},
            "models": models,
            "groups": groups,
        })

    async def vram_status(self, request: Request) -> None:
        devices = [
            {
                "device": d.device,
                "kind": d.kind,
                "total_bytes": d.total_bytes,
                "used_bytes": d.used_bytes,
                "free_bytes": d.free_bytes,
                "source": d.source,
            }
            for d in memory.devices()
        ]
        models = []
        for name, r in self.manager.runners.items():
            b = r.loaded.buffers if r.loaded else None
            models.append(
                {
                    "name": name,
                    "state": r.state,
                    "device": "cpu",
                    "weights_bytes": b.weights if b else 0,
                    "kv_cache_bytes": b.kv if b else 0,
                    "compute_bytes": (b.compute + b.output) if b else 0,
                    "total_bytes": (b.weights + b.kv + b.compute + b.output) if b else 0,
                    "kv_type_k": r.cfg.kv_cache.type_k,
                    "kv_type_v": r.cfg.kv_cache.type_v,
                    "n_ctx": r.cfg.n_ctx,
                    "n_parallel": r.cfg.n_parallel,
                    "n_ctx_total": r.loaded.n_ctx_total if r.loaded else 0,
                }
            )
        await request.json(200, {"devices": devices, "models": models})
