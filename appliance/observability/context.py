"""What one HTTP request did, gathered as it runs; read by the logs, the metrics and the audit trail."""

from __future__ import annotations

import contextvars
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

_VALID_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")


@dataclass
class RequestInfo:
    id: str
    method: str
    path: str
    started: float = field(default_factory=time.monotonic)
    key_id: str | None = None
    status: int = 0
    models: list[str] = field(default_factory=list)
    group: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error_code: str | None = None
    # Only with audit.include_content: the request body's text and the answer.
    content: dict | None = None
    action: dict | None = None  # admin actions: what was asked (model, mode, ...)
    # The models this request holds in use (manager.hold), released when it ends; a hold asked
    # after its end (work the request left running, as a background response) is not taken.
    releases: list[Callable[[], None]] = field(default_factory=list)
    ended: bool = False
    background: bool = False  # a background response's work, after its POST answered
    completed: bool = False  # the response's last body part went out
    keep_alive_said: bool = False  # an Ollama request took its keep_alive (or its absence) for its model

    def add_model(self, name: str) -> None:
        if name not in self.models:
            self.models.append(name)

    def release_holds(self) -> None:
        """The request has ended: its holds go."""
        self.ended = True
        for release in self.releases:
            release()
        self.releases.clear()

    def seconds(self) -> float:
        return time.monotonic() - self.started


current: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar("eie_request", default=None)


def request_id(given: str | None) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one."""
    if given and _VALID_ID.match(given):
        return given
    return uuid.uuid4().hex


def info() -> RequestInfo | None:
    return current.get()


def key_id() -> str | None:
    """The API key id the current request was made with (None: no keys, or outside a request):
    the owner of what it stores."""
    request = current.get()
    return request.key_id if request is not None else None
