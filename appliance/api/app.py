"""The ASGI application: routing, auth, the error envelope, lifespan, health and memory status."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from typing import Any, Awaitable, Callable

from ..config import Config, ConfigError, load_config
from ..engine.manager import ModelManager
from .errors import ApiError
from .http import Receive, Request, Send
from .admin_routes import AdminRoutes
from .group_routes import GroupRoutes
from .openai_routes import OpenAIRoutes
from .reload import plan_reload

log = logging.getLogger("eie.api")

Handler = Callable[[Request], Awaitable[None]]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class App:
    def __init__(self, config: Config, manager: ModelManager, config_path: str | None = None):
        self.config = config
        self.config_path = config_path
        self.manager = manager
        self.openai = OpenAIRoutes(config, manager)
        self.groups = GroupRoutes(config, manager)
        self.admin = AdminRoutes(config, manager)
        self._set_keys(config)
        self.routes: dict[str, dict[str, tuple[Handler, bool]]] = {
            "/v1/chat/completions": {"POST": (self.openai.chat, True)},
            "/v1/completions": {"POST": (self.openai.completions, True)},
            "/v1/models": {"GET": (self.openai.models, True)},
            "/v1/batch/execute": {"POST": (self.groups.batch, True)},
            "/v1/chain/execute": {"POST": (self.groups.chain, True)},
            "/health": {"GET": (self.admin.health, False)},
            "/v1/admin/vram/status": {"GET": (self.admin.vram_status, True)},
            "/v1/admin/scheduling/status": {"GET": (self.admin.scheduling_status, True)},
            "/v1/admin/models/load": {"POST": (self.admin.load, True)},
            "/v1/admin/models/unload": {"POST": (self.admin.unload, True)},
            "/v1/admin/models/discover": {"GET": (self.admin.discover, True)},
            "/v1/admin/kv/convert": {"POST": (self.admin.kv_convert, True)},
            "/v1/admin/kv/warm": {"POST": (self.admin.kv_warm, True)},
            "/v1/admin/kv/status": {"GET": (self.admin.kv_status, True)},
            "/v1/admin/kv/flush": {"POST": (self.admin.kv_flush, True)},
            "/v1/admin/config/reload": {"POST": (self.reload, True)},
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
                self._authorize(request, admin=request.path.startswith("/v1/admin/"))
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

    def _set_keys(self, config: Config) -> None:
        self._key_digests = [_digest(k) for k in config.server.api_keys]
        admin = config.server.admin_keys or config.server.api_keys
        self._admin_digests = [_digest(k) for k in admin]

    def apply_config(self, config: Config) -> None:
        """Point every part at a reloaded config (see admin config reload)."""
        self.config = config
        self._set_keys(config)
        self.openai.config = config
        self.groups.set_config(config)
        self.admin.config = config

    def _authorize(self, request: Request, admin: bool = False) -> None:
        digests = self._admin_digests if admin else self._key_digests
        if not digests and not (admin and self._key_digests):
            return
        auth = request.header("authorization") or ""
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        # Compare fixed-length digests so the time taken does not depend on how much of a key matched.
        given = _digest(token.strip())
        ok = False
        for d in digests:
            ok |= hmac.compare_digest(given, d)
        if not ok:
            if admin and any(hmac.compare_digest(given, d) for d in self._key_digests):
                raise ApiError(403, "this key may not use admin endpoints", type="permission_error",
                               code="admin_key_required")
            raise ApiError(401, "invalid API key", code="invalid_api_key")

    async def reload(self, request: Request) -> None:
        """Re-read the config file: apply what can change live, report what needs a restart,
        keep the old config on any error."""
        await request.body(self.config.server.limits.max_body_bytes)
        path = self.config_path
        if path is None:
            raise ApiError(409, "this server was not started from a config file", code="no_config_file")
        try:
            new = await asyncio.to_thread(load_config, path)
        except ConfigError as e:
            raise ApiError(400, "config reload failed; the running config is unchanged: " + "; ".join(e.problems),
                           param="config", code="invalid_config") from None
        plan = plan_reload(self.config, new)
        # Reading GGUF headers to decide auto KV types blocks: off the event loop.
        added = await asyncio.to_thread(self.manager.apply_config, plan.config, plan.added_models)
        self.apply_config(plan.config)
        await request.json(200, {"applied": plan.applied, "restart_required": plan.restart_required,
                                 "added_models": added, "config": str(path)})

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
                await asyncio.to_thread(self.manager.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return
