"""The ASGI application: routing, auth and limits, the error envelope, request accounting (request
id, metrics, structured log, audit), lifespan, drain and reload."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator

import msgspec

from ..config import Config, ConfigError, load_config
from ..engine import client
from ..engine.manager import ModelManager
from ..observability import context
from ..observability.audit import AuditTrail
from ..observability.metrics import CONTENT_TYPE, Metrics
from ..resources import memory
from . import openapi
from .admin_routes import AdminRoutes
from .probes import run_probe
from .auth import Key, KeyFileError, KeyRing, read_key_file
from .errors import ApiError
from .group_chat import GroupChat
from .anthropic_batches import MessageBatchRoutes
from .batch_routes import BatchRoutes
from .batch_runner import InternalAnswer
from .batch_store import BatchStore
from .chat_completion_routes import StoredChatRoutes
from .chat_completion_store import ChatCompletionStore
from .conversation_routes import ConversationRoutes
from .file_store import FileStore
from .files_routes import FilesRoutes
from .conversation_store import ConversationStore
from .responses_background import BackgroundResponses
from .group_routes import GroupRoutes
from .llama_server_routes import LlamaServerRoutes
from .http import ClientGone, Receive, Request, Send
from .limits import KeyLimits, LimitExceeded
from .anthropic_output import error_body as anthropic_error
from .anthropic_routes import AnthropicRoutes
from .ollama_output import error_body as ollama_error
from .ollama_routes import OllamaRoutes
from .openai_routes import OpenAIRoutes
from .response_store import ResponseStore
from .responses_routes import ResponsesRoutes
from .token_routes import TokenRoutes
from .embedding_routes import EmbeddingRoutes
from .reload import plan_reload

log = logging.getLogger("eie.api")
access = logging.getLogger("eie.access")

Handler = Callable[[Request], Awaitable[None]]


@dataclass(frozen=True)
class Route:
    handler: Handler
    auth: str  # open | key | admin | metrics
    limited: bool = False  # counts against the per-key rate and concurrency limits
    accounted: bool = True  # audited and drained (probes and scrapes are not)
    error_body: Callable[[ApiError], bytes] = ApiError.body  # the error envelope its clients read
    # Anthropic's clients read it too (they send anthropic-version): their errors in their envelope,
    # the auth and limit refusals before the handler included
    anthropic_too: bool = False


_QUIET = {"/health", "/metrics", "/openapi.json", "/"}


class App:
    def __init__(self, config: Config, manager: ModelManager, config_path: str | None = None):
        self.config = config
        self.config_path = config_path
        self.manager = manager
        self.openai = OpenAIRoutes(config, manager)
        stored = config.server.responses
        self.responses = ResponsesRoutes(config, manager, ResponseStore(stored.max_entries, stored.max_mb << 20,
                                                                        config.responses_dir()))
        self.conversations = ConversationRoutes(config, ConversationStore(stored.max_entries, stored.max_mb << 20,
                                                                          config.conversations_dir()))
        self.responses.conversations = self.conversations.store
        self.stored_chats = StoredChatRoutes(config, ChatCompletionStore(stored.max_entries, stored.max_mb << 20,
                                                                         config.chat_completions_dir()))
        self.openai.stored = self.stored_chats
        self.files = FilesRoutes(config, FileStore(config.files_dir(), config.server.files.max_mb << 20))
        self.batches = BatchRoutes(config, BatchStore(config.files_dir() / "batches"), self.files.store,
                                   self.call_internal)
        self.files.user_of = self.batches.store.file_user
        self.message_batches = MessageBatchRoutes(config, self.batches.store, self.files.store, self.batches.runner)
        self.anthropic = AnthropicRoutes(config, manager)
        self.tokens = TokenRoutes(config, manager)
        self.llama_server = LlamaServerRoutes(config, manager)
        self.embeddings = EmbeddingRoutes(config, manager)
        self.ollama = OllamaRoutes(config, manager, self.embeddings)
        self.groups = GroupRoutes(config, manager)
        self.admin = AdminRoutes(config, manager)
        self.keys = self._keyring(config)
        self.limits = KeyLimits(config.server.limits.rate_per_minute, config.server.limits.concurrent_requests)
        self.metrics = Metrics(manager, memory.devices, self._extra_metrics)
        self.groups.on_result = self.metrics.observe_group
        self.openai.groups = self.ollama.groups = self.responses.groups = self.anthropic.groups = GroupChat(self.groups)
        self.audit = self._audit(config)
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.admin.draining = lambda: self.draining
        self.responses.background = BackgroundResponses(self._background, self._account_background)
        self._reload_lock = asyncio.Lock()  # reloads one at a time (reload_config)
        self.routes: dict[str, dict[str, Route]] = {
            "/v1/chat/completions": {"POST": Route(self.openai.chat, "key", True),
                                     "GET": Route(self.stored_chats.listed, "key")},
            "/v1/chat/completions/{completion_id}": {"GET": Route(self.stored_chats.retrieve, "key"),
                                                     "POST": Route(self.stored_chats.update, "key"),
                                                     "DELETE": Route(self.stored_chats.delete, "key")},
            "/v1/chat/completions/{completion_id}/messages": {"GET": Route(self.stored_chats.messages, "key")},
            "/v1/completions": {"POST": Route(self.openai.completions, "key", True)},
            "/completion": {"POST": Route(self.llama_server.completion, "key", True)},  # llama-server's own
            "/infill": {"POST": Route(self.llama_server.infill, "key", True)},
            "/props": {"GET": Route(self.llama_server.props, "key")},
            "/lora-adapters": {"GET": Route(self.llama_server.lora_adapters, "key"),
                               "POST": Route(self.llama_server.set_lora_adapters, "admin")},
            "/apply-template": {"POST": Route(self.llama_server.apply_template, "key")},
            "/v1/models": {"GET": Route(self.openai.models, "key", anthropic_too=True)},
            "/v1/models/{model_id}": {"GET": Route(self.openai.model, "key", anthropic_too=True)},
            "/v1/responses": {"POST": Route(self.responses.create, "key", True)},
            "/v1/responses/input_tokens": {"POST": Route(self.responses.input_tokens, "key")},
            "/v1/messages": {"POST": Route(self.anthropic.messages, "key", True, error_body=anthropic_error)},
            "/v1/messages/count_tokens": {"POST": Route(self.anthropic.count_tokens, "key",
                                                        error_body=anthropic_error)},
            "/v1/messages/batches": {"POST": Route(self.message_batches.create, "key", error_body=anthropic_error),
                                     "GET": Route(self.message_batches.listed, "key", error_body=anthropic_error)},
            "/v1/messages/batches/{batch_id}": {
                "GET": Route(self.message_batches.retrieve, "key", error_body=anthropic_error),
                "DELETE": Route(self.message_batches.delete, "key", error_body=anthropic_error)},
            "/v1/messages/batches/{batch_id}/cancel": {
                "POST": Route(self.message_batches.cancel, "key", error_body=anthropic_error)},
            "/v1/messages/batches/{batch_id}/results": {
                "GET": Route(self.message_batches.results, "key", error_body=anthropic_error)},
            "/v1/responses/{response_id}": {"GET": Route(self.responses.retrieve, "key"),
                                            "DELETE": Route(self.responses.delete, "key")},
            "/v1/responses/{response_id}/input_items": {"GET": Route(self.responses.input_items, "key")},
            "/v1/responses/{response_id}/cancel": {"POST": Route(self.responses.cancel, "key")},
            "/v1/files": {"POST": Route(self.files.upload, "key"), "GET": Route(self.files.listed, "key")},
            "/v1/files/{file_id}": {"GET": Route(self.files.retrieve, "key"), "DELETE": Route(self.files.delete, "key")},
            "/v1/files/{file_id}/content": {"GET": Route(self.files.content, "key")},
            "/v1/batches": {"POST": Route(self.batches.create, "key"), "GET": Route(self.batches.listed, "key")},
            "/v1/batches/{batch_id}": {"GET": Route(self.batches.retrieve, "key")},
            "/v1/batches/{batch_id}/cancel": {"POST": Route(self.batches.cancel, "key")},
            "/v1/conversations": {"POST": Route(self.conversations.create, "key")},
            "/v1/conversations/{conversation_id}": {"GET": Route(self.conversations.retrieve, "key"),
                                                    "POST": Route(self.conversations.update, "key"),
                                                    "DELETE": Route(self.conversations.delete, "key")},
            "/v1/conversations/{conversation_id}/items": {"GET": Route(self.conversations.list_items, "key"),
                                                          "POST": Route(self.conversations.add_items, "key")},
            "/v1/conversations/{conversation_id}/items/{item_id}": {
                "GET": Route(self.conversations.get_item, "key"), "DELETE": Route(self.conversations.delete_item, "key")},
            "/v1/embeddings": {"POST": Route(self.embeddings.embeddings, "key", True)},
            "/v1/rerank": {"POST": Route(self.embeddings.rerank, "key", True)},
            "/rerank": {"POST": Route(self.embeddings.rerank, "key", True)},  # llama-server's and Jina's path
            **self._ollama_routes(),
            "/tokenize": {"POST": Route(self.tokens.tokenize, "key")},
            "/detokenize": {"POST": Route(self.tokens.detokenize, "key")},
            "/v1/batch/execute": {"POST": Route(self.groups.batch, "key", True)},
            "/v1/chain/execute": {"POST": Route(self.groups.chain, "key", True)},
            "/health": {"GET": Route(self.admin.health, "open", accounted=False)},
            # Ollama's heartbeat (its CLI asks HEAD / before anything else)
            "/": {"GET": Route(self.root, "open", accounted=False)},
            "/metrics": {"GET": Route(self.serve_metrics, "metrics", accounted=False)},
            "/openapi.json": {"GET": Route(self.serve_openapi, "open", accounted=False)},
            "/v1/admin/vram/status": {"GET": Route(self.admin.vram_status, "admin")},
            "/v1/admin/scheduling/status": {"GET": Route(self.admin.scheduling_status, "admin")},
            "/v1/admin/models/load": {"POST": Route(self.admin.load, "admin")},
            "/v1/admin/models/unload": {"POST": Route(self.admin.unload, "admin")},
            "/v1/admin/models/discover": {"GET": Route(self.admin.discover, "admin")},
            "/v1/admin/kv/convert": {"POST": Route(self.admin.kv_convert, "admin")},
            "/v1/admin/kv/warm": {"POST": Route(self.admin.kv_warm, "admin")},
            "/v1/admin/kv/status": {"GET": Route(self.admin.kv_status, "admin")},
            "/v1/admin/kv/flush": {"POST": Route(self.admin.kv_flush, "admin")},
            "/v1/admin/config/reload": {"POST": Route(self.reload, "admin")},
        }
        client.add_tap(self._tap)

    # ---- set-up ----------------------------------------------------------------------------

    def _ollama_routes(self) -> dict[str, dict[str, Route]]:
        o = self.ollama
        generation = {"/api/chat": o.chat, "/api/generate": o.generate, "/api/embed": o.embed,
                      "/api/embeddings": o.embeddings_legacy}
        routes = {path: {"POST": Route(handler, "key", True, error_body=ollama_error)}
                  for path, handler in generation.items()}
        routes.update({path: {"GET": Route(handler, "key", error_body=ollama_error)}
                       for path, handler in (("/api/tags", o.tags), ("/api/ps", o.ps), ("/api/version", o.version))})
        routes["/api/show"] = {"POST": Route(o.show, "key", error_body=ollama_error)}
        for path in ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete"):
            routes[path] = {method: Route(o.refused, "key", error_body=ollama_error) for method in ("POST", "DELETE")}
        return routes

    @staticmethod
    def _keyring(config: Config) -> KeyRing:
        path = config.key_file()
        file_keys = read_key_file(path) if path is not None else []
        return KeyRing(config.server.api_keys, config.server.admin_keys, file_keys)

    @staticmethod
    def _audit(config: Config) -> AuditTrail | None:
        path = config.audit_path()
        if path is None:
            return None
        a = config.audit
        return AuditTrail(path, a.max_mb * 1024 * 1024, a.keep, a.include_content)

    def _extra_metrics(self) -> dict:
        return {
            "eie_in_flight_requests": ("HTTP requests being served and background responses being made",
                                       self.in_flight),
            "eie_draining": ("1 while the server drains for shutdown", int(self.draining)),
            "eie_audit_write_errors_total": ("Audit records that could not be written",
                                             self.audit.errors if self.audit else 0),
            "eie_batches_running": ("Batches (the Batch API) whose requests are being run",
                                    self.batches.runner.running),
            "eie_files_bytes": ("Bytes the Files API's files take (uploads and batch results)",
                                self.files.store.bytes),
        }

    def apply_config(self, config: Config) -> None:
        """Point every part at a reloaded config (see admin config reload)."""
        self.keys = self._keyring(config)  # the key file is read again too
        lim, lim_store = config.server.limits, config.server.responses
        self.limits.rate, self.limits.concurrent = lim.rate_per_minute, lim.concurrent_requests
        self.config = config
        self.openai.config = config
        self.responses.config = config
        self.anthropic.config = config
        self.ollama.config = config
        self.responses.store.resize(lim_store.max_entries, lim_store.max_mb << 20)
        self.conversations.store.resize(lim_store.max_entries, lim_store.max_mb << 20)
        self.stored_chats.store.resize(lim_store.max_entries, lim_store.max_mb << 20)
        self.stored_chats.config = config
        self.conversations.config = config
        self.files.config = config
        self.files.store.max_bytes = config.server.files.max_mb << 20
        self.batches.config = config
        self.message_batches.config = config
        self.tokens.config = config
        self.llama_server.config = config  # (left out, /completion and /infill kept the boot config's limits)
        self.embeddings.config = config
        self.groups.set_config(config)
        self.admin.config = config

    # ---- requests --------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        info = context.RequestInfo(context.request_id(_header(scope, b"x-request-id")), scope["method"],
                                   scope["path"])
        rid = info.id.encode()

        send_failed = False
        head = scope["method"] == "HEAD"
        cors = cors_origin(self.config.server.cors_origins, _header(scope, b"origin"))
        if cors is not None and scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
            await _preflight(send, cors, _header(scope, b"access-control-request-headers"))
            return

        async def send_tagged(msg: dict[str, Any]) -> None:
            nonlocal send_failed
            if msg["type"] == "http.response.start":
                info.status = msg["status"]
                msg = {**msg, "headers": [*msg.get("headers", []), (b"x-request-id", rid),
                                          *(cors_headers(cors) if cors is not None else ())]}
            elif msg["type"] == "http.response.body":
                if not msg.get("more_body", False):  # (an end written after its client went: not its answer)
                    info.completed = not request.disconnected.is_set()
                if head:
                    msg = {**msg, "body": b""}
            try:
                await send(msg)
            except OSError as e:  # the connection is gone: told apart from the server's own I/O errors
                send_failed = True
                raise ClientGone(str(e)) from e

        if self.audit is not None and self.audit.include_content:
            info.content = {}
        token = context.current.set(info)
        request = Request(scope, receive, send_tagged)
        request.keepalive_s = self.config.server.stream_keepalive_s
        route: Route | None = None
        counted = contextlib.ExitStack()  # holds the in-flight count while the request is served
        try:
            route = self._route(request)
            request.error_body = (anthropic_error if route.anthropic_too and request.header("anthropic-version")
                                  is not None else route.error_body)
            if "eie.internal_key" in scope:  # a batch's request, made inside the server as its key (call_internal)
                info.key_id = scope["eie.internal_key"]
                await route.handler(request)
                return
            if route.accounted:
                if self.draining:
                    raise ApiError(503, "the server is shutting down", type="service_unavailable",
                                   code="draining", headers=[(b"retry-after", b"5")])
                counted.enter_context(self._counted())
            key = self._authorize(request, route.auth)
            if route.limited:
                request.limit_holder = self._limit(
                    key.id if key else "addr:" + str((scope.get("client") or ("?",))[0]))
            await route.handler(request)
        except ApiError as e:
            info.error_code = e.code or e.type
            if e.status == 499:
                info.status = info.status or 499  # the client is gone; nobody to answer
            else:
                await self._safe_error(request, e)
        except RecursionError:  # JSON nested deeper than the decoder goes (inside free-form fields)
            info.error_code = "invalid_json"
            await self._safe_error(request, ApiError(400, "request body is nested too deeply", code="invalid_json"))
        except ClientGone:
            info.status = info.status or 499  # client disconnected while we were answering
        except OSError as e:  # the server's own I/O (its state directory full, a read error)
            log.exception("I/O error on %s %s", request.method, request.path)
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            info.error_code = "insufficient_storage" if full else "internal"
            await self._safe_error(request, ApiError(
                507 if full else 500, f"the server could not store what this request makes: {e.strerror or e}"
                if full else f"the server hit an I/O error: {e.strerror or e}",
                type="insufficient_storage" if full else "server_error", code=info.error_code))
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            info.error_code = "internal"
            await self._safe_error(request, ApiError(500, "internal server error", type="server_error"))
        finally:
            if request.stream is not None:
                request.stream.stop()
            if request.limit_holder is not None:  # (a background response takes its POST's over)
                self.limits.release(request.limit_holder)
            counted.close()
            info.release_holds()
            if (request.disconnected.is_set() or send_failed) and not info.completed:  # gone before its end
                info.status, info.error_code = 499, info.error_code or "client_disconnected"
            self._account(info, request, route)
            context.current.reset(token)

    async def call_internal(self, method: str, path: str, body: bytes, key_id: str | None,
                            cancel: asyncio.Event) -> InternalAnswer:
        """A request made inside the server (a batch's), answered by its route as key `key_id`'s,
        without the key's limits; `cancel` reads to it as its client going away."""
        scope = {"type": "http", "method": method, "path": path, "query_string": b"", "client": ("batch", 0),
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "eie.internal_key": key_id}
        answer: dict[str, Any] = {"status": 500, "body": [], "id": "", "retry": False}
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await cancel.wait()
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                headers = dict(msg.get("headers", []))
                answer["status"] = msg["status"]
                answer["id"] = headers.get(b"x-request-id", b"").decode()
                answer["retry"] = b"retry-after" in headers
            elif msg["type"] == "http.response.body":
                answer["body"].append(msg.get("body", b""))

        await self(scope, receive, send)
        return InternalAnswer(answer["status"], b"".join(answer["body"]), answer["id"], answer["retry"])

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        """Work in flight, which the drain waits for: a request being served, or a background
        response's answer."""
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    @contextlib.contextmanager
    def _background(self, holder: str | None) -> Iterator[None]:
        """A background response's work: in flight, and one of its key's concurrent requests (the
        POST's, which it took over: BackgroundResponses.start) until it ends."""
        with self._counted():
            try:
                yield
            finally:
                if holder is not None:
                    self.limits.release(holder)

    def _limit(self, who: str) -> str:
        """Count the request against its key's limits (429 when over one); returns `who`."""
        try:
            self.limits.acquire(who)
        except LimitExceeded as e:
            self.metrics.refused.labels(e.limit).inc()
            raise ApiError(429, str(e), type="rate_limit_error", code=e.limit,
                           headers=[(b"retry-after", str(e.retry_after).encode())]) from None
        return who

    def _route(self, request: Request) -> Route:
        path = request.path.rstrip("/") or "/"
        methods = self.routes.get(path)
        if methods is None:
            methods = self._templated(request, path)
        if methods is None:
            raise ApiError(404, f"no such endpoint: {request.method} {request.path}", code="not_found")
        route = methods.get(request.method)
        if route is None and request.method == "HEAD":  # GET's answer without its body (RFC 9110 9.3.2)
            route = methods.get("GET")
        if route is None:
            allow = ", ".join(sorted({*methods, *(("HEAD",) if "GET" in methods else ())})).encode()
            raise ApiError(405, f"method {request.method} is not allowed on {request.path}",
                           code="method_not_allowed", headers=[(b"allow", allow)])
        return route

    def _templated(self, request: Request, path: str) -> dict[str, Route] | None:
        """The routes of a path with {name} segments that `path` fills (request.path_params, and
        request.template: what metrics and logs call the endpoint)."""
        parts = path.split("/")
        for template, methods in self.routes.items():
            names = template.split("/")
            if "{" not in template or len(names) != len(parts):
                continue
            params = {}
            for name, part in zip(names, parts):
                if name.startswith("{"):
                    if not part:
                        break
                    params[name[1:-1]] = part
                elif name != part:
                    break
            else:
                request.path_params, request.template = params, template
                return methods
        return None

    @staticmethod
    async def _safe_error(request: Request, err: ApiError) -> None:
        stream = request.stream
        try:
            if stream is not None and stream.started:
                # a keep-alive started the response: the error is the stream's last event, named
                # so that the OpenAI and Anthropic SDKs raise it
                if not stream.closed and stream.content_type == b"text/event-stream":
                    await stream.raw(b"event: error\ndata: " + request.error_body(err) + b"\n\n")
                    await stream.close()
                return
            if stream is not None:
                stream.stop()  # no keep-alive may start a response under the error's
            await request.error(err)
        except (OSError, RuntimeError):
            pass  # response already started or client gone

    def _authorize(self, request: Request, level: str) -> Key | None:
        if level == "metrics":
            level = self.config.server.metrics_auth
        if level == "open" or self.keys.open:
            return None
        auth = request.header("authorization") or ""
        scheme, _, token = auth.partition(" ")
        if not auth and request.header("x-api-key"):  # Anthropic's SDKs send the key so
            scheme, token = "bearer", request.header("x-api-key") or ""
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                           code="invalid_api_key")
        key = self.keys.match(token.strip())
        if key is None:
            raise ApiError(401, "invalid API key", code="invalid_api_key")
        info = context.current.get()
        if info is not None:
            info.key_id = key.id  # recorded for refusals too
        if level == "admin" and not key.admin:
            raise ApiError(403, "this key may not use admin endpoints", type="permission_error",
                           code="admin_key_required")
        return key

    # ---- accounting ------------------------------------------------------------------------

    def _tap(self, gens: client.Generations, i: int, ev: Any, first: bool, seconds: float) -> None:
        self.metrics.tap(gens, i, ev, first, seconds)
        info = context.current.get()
        if info is None:
            return
        info.add_model(gens.runner.name)
        kind = type(ev).__name__
        if kind in ("Finished", "Failed"):  # (a sequence cut short counts what it did)
            info.completion_tokens += ev.completion_tokens
            if i == 0 or info.prompt_tokens == 0:
                info.prompt_tokens += ev.prompt_tokens
        elif kind == "TextDelta" and info.content is not None:
            info.content.setdefault("output", {}).setdefault(f"{gens.runner.name}[{i}]", []).append(ev.text)

    def _account(self, info: context.RequestInfo, request: Request, route: Route | None) -> None:
        known = route is not None
        endpoint = (request.template or request.path.rstrip("/") or "/") if known else "other"
        try:
            self.metrics.observe_request(info, endpoint)
        except Exception:
            log.exception("metrics failed")
        if endpoint == "/health" or (endpoint in _QUIET and info.status < 400):
            return  # probes and scrapes (a refused scrape is logged)
        self._log_and_audit(info, request.raw_body, endpoint, known and endpoint not in _QUIET)

    def _account_background(self, info: context.RequestInfo, body: bytes | None) -> None:
        """A background response's work, ended: its access line and audit record (its POST's,
        which answered `queued`, have no tokens). Metrics counted its tokens as they came."""
        try:
            self._log_and_audit(info, body, "/v1/responses", True)
        except Exception:
            log.exception("accounting a background response failed")

    def _log_and_audit(self, info: context.RequestInfo, body: bytes | None, endpoint: str, audited: bool) -> None:
        ms = round(info.seconds() * 1000, 1)
        extra = {"status": info.status, "duration_ms": ms, "key_id": info.key_id, "models": info.models,
                 "group": info.group, "prompt_tokens": info.prompt_tokens,
                 "completion_tokens": info.completion_tokens, "error": info.error_code}
        if info.background:
            extra["background"] = True
        access.info("%s %s %s %.1fms%s", info.method, info.path, info.status, ms,
                    " (background)" if info.background else "", extra=extra)
        if self.audit is not None and audited:
            self._audit_record(info, body, endpoint)

    def _audit_record(self, info: context.RequestInfo, body: bytes | None, endpoint: str) -> None:
        admin = endpoint.startswith("/v1/admin/")
        fields: dict[str, Any] = {
            "request_id": info.id, "key_id": info.key_id, "method": info.method, "path": endpoint,
            "status": info.status, "outcome": "ok" if info.status < 400 else (info.error_code or "error"),
            "models": info.models, "group": info.group, "prompt_tokens": info.prompt_tokens,
            "completion_tokens": info.completion_tokens, "duration_ms": round(info.seconds() * 1000, 1),
        }
        if info.background:
            fields["background"] = True
        if admin and body:
            fields["action"] = _admin_action(body, self.audit.include_content)
        if self.audit.include_content and not admin and body:
            fields["content"] = _content(body, info)
        self.audit.record("admin" if admin else "request", **fields)

    # ---- operations endpoints --------------------------------------------------------------

    async def serve_metrics(self, request: Request) -> None:
        body = await run_probe(self.metrics.render)  # device probes stay off the loop
        await request.respond(200, body, CONTENT_TYPE.encode())

    async def root(self, request: Request) -> None:
        await request.respond(200, b"Ollama is running", b"text/plain; charset=utf-8")

    async def serve_openapi(self, request: Request) -> None:
        await request.json(200, openapi.build(self.config.server.metrics_auth, [m.name for m in self.config.models],
                                              [(g.name, g.type) for g in self.config.groups]))

    async def reload(self, request: Request) -> None:
        """Re-read the config file: apply what can change live, report what needs a restart,
        keep the old config on any error."""
        await request.body(self.config.server.limits.max_body_bytes)
        if self.config_path is None:
            raise ApiError(409, "this server was not started from a config file", code="no_config_file")
        try:
            result = await self.reload_config()
        except (ConfigError, KeyFileError) as e:
            problems = "; ".join(e.problems) if isinstance(e, ConfigError) else str(e)
            raise ApiError(400, "config reload failed; the running config is unchanged: " + problems,
                           param="config", code="invalid_config") from None
        await request.json(200, result)

    async def reload_config(self) -> dict:
        """The reload itself (admin endpoint and SIGHUP), one at a time: two that overlapped each
        planned against the old config, and a model both added was loaded twice, one copy
        orphaned. Raises ConfigError or KeyFileError."""
        async with self._reload_lock:
            return await self._reload_config()

    async def _reload_config(self) -> dict:
        new = await asyncio.to_thread(load_config, self.config_path)
        plan = plan_reload(self.config, new)
        self._keyring(plan.config)  # a broken key file refuses the reload before anything changes
        # Reading GGUF headers to decide auto KV types blocks: off the event loop.
        added = await asyncio.to_thread(self.manager.apply_config, plan.config, plan.added_models)
        self.apply_config(plan.config)
        log.info("config reloaded from %s", self.config_path,
                 extra={"applied": plan.applied, "restart_required": plan.restart_required})
        if self.audit is not None:
            self.audit.record("admin", path="reload", outcome="ok", applied=plan.applied,
                              restart_required=plan.restart_required)
        return {"applied": plan.applied, "restart_required": plan.restart_required,
                "added_models": added, "config": str(self.config_path)}

    async def reload_on_signal(self) -> None:
        try:
            await self.reload_config()
        except (ConfigError, KeyFileError) as e:
            log.error("SIGHUP reload failed; the running config is unchanged: %s", e)
            if self.audit is not None:
                self.audit.record("admin", path="reload", outcome="invalid_config")
        except Exception:  # (a bug in the reload: said, not an unretrieved task exception)
            log.exception("SIGHUP reload failed")
            if self.audit is not None:
                self.audit.record("admin", path="reload", outcome="internal")

    async def drain(self, grace_s: float) -> dict:
        """Refuse new work (503 draining), let in-flight requests finish for up to `grace_s`,
        then end the rest with a shutdown error; returns what happened."""
        self.draining = True
        await self.batches.runner.stop()  # its requests run again after the restart
        t0 = time.monotonic()
        at_start = self.in_flight
        log.info("draining: %d requests in flight, grace %.0fs", at_start, grace_s)
        if self.in_flight:
            try:
                await asyncio.wait_for(self._idle.wait(), grace_s)
            except TimeoutError:
                pass
        aborted = 0
        if self.in_flight:
            for gens in list(client.Generations.live):
                gens.abort("shutdown", "the server is shutting down (drain grace period over)")
                aborted += 1
            try:
                await asyncio.wait_for(self._idle.wait(), 5)
            except TimeoutError:
                pass
        result = {"in_flight_at_start": at_start, "aborted": aborted, "left": self.in_flight,
                  "seconds": round(time.monotonic() - t0, 2)}
        log.info("drained", extra=result)
        if self.audit is not None:
            self.audit.record("lifecycle", event="drain", **result)
        return result

    async def stop_now(self) -> None:
        """Stop without waiting (a second SIGTERM, SIGINT): refuse new work, end the live answers
        with the shutdown error now (streams end with it and [DONE]), then give their responses a
        moment to go out."""
        self.draining = True
        batches = asyncio.ensure_future(self.batches.runner.stop())  # its requests run again after the restart
        live = list(client.Generations.live)
        for gens in live:
            gens.abort("shutdown", "the server is stopping now")
        log.info("stopping now: %d answers ended", len(live))
        await batches
        if self.in_flight:
            try:
                await asyncio.wait_for(self._idle.wait(), 5)
            except TimeoutError:
                pass

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self.loop = asyncio.get_running_loop()
                try:
                    self.manager.start()
                except Exception as e:
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                if self.audit is not None:
                    self.audit.record("lifecycle", event="start", models=list(self.manager.runners))
                self.batches.runner.resume()  # the batches a previous run left unfinished
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                # Runners stop (their prefix stores finish queued disk writes), then the trail closes.
                await asyncio.to_thread(self.responses.store.close)
                await asyncio.to_thread(self.conversations.store.close)
                await asyncio.to_thread(self.stored_chats.store.close)
                await self.batches.runner.stop()
                await asyncio.to_thread(self.manager.stop)
                if self.audit is not None:
                    self.audit.record("lifecycle", event="stop")
                    await asyncio.to_thread(self.audit.close)
                client.remove_tap(self._tap)
                await send({"type": "lifespan.shutdown.complete"})
                return


def cors_origin(allowed: list[str], origin: str | None) -> str | None:
    """The Access-Control-Allow-Origin a request from `origin` gets (None: no CORS headers)."""
    if origin is None or not allowed:
        return None
    if "*" in allowed:
        return "*"
    return origin if origin in allowed else None


def cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode()), (b"vary", b"origin"),
            (b"access-control-expose-headers", b"x-request-id, retry-after")]


async def _preflight(send: Send, origin: str, asked_headers: str | None) -> None:
    """A browser's preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin:
    204 with what may be sent (the headers it asked for, or the APIs' own)."""
    headers = asked_headers or "authorization, content-type, x-api-key, anthropic-version, x-request-id"
    await send({"type": "http.response.start", "status": 204, "headers": [
        *cors_headers(origin), (b"access-control-allow-methods", b"GET, HEAD, POST, DELETE, OPTIONS"),
        (b"access-control-allow-headers", headers.encode("latin-1", "replace")),
        (b"access-control-max-age", b"600"), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


# the request fields that are its prompt, in every API's spelling (the Responses API's input and
# instructions, Anthropic's system, a fill-in-the-middle's suffix)
_CONTENT_KEYS = ("prompt", "messages", "input", "instructions", "system", "suffix")


def _admin_action(body: bytes, include_content: bool) -> dict:
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {"invalid_json": True}
    if not isinstance(obj, dict):
        return {"invalid_body": True}
    return {k: v for k, v in obj.items() if include_content or k not in _CONTENT_KEYS}


def _content(body: bytes, info: context.RequestInfo) -> dict:
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {"invalid_json": True}
    out = {k: obj[k] for k in _CONTENT_KEYS if isinstance(obj, dict) and k in obj}
    if info.content:
        out["output"] = {k: "".join(v) for k, v in info.content.get("output", {}).items()}
    return out
