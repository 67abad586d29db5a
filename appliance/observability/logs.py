"""Structured logs: one JSON object per line, with the request id of the request being served."""

from __future__ import annotations

import json
import logging
import sys
import time

from . import context

_STD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        req = context.current.get()
        if req is not None:
            out["request_id"] = req.id
        for key, value in vars(record).items():  # extra={...} fields
            if key not in _STD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        req = context.current.get()
        return f"{line} [request_id={req.id}]" if req is not None else line


def setup(level: str = "info", fmt: str = "json") -> None:
    """Route every logger (uvicorn's too) through one handler in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True


def uvicorn_log_config() -> dict:
    """uvicorn's own logging setup, reduced to 'use the root handler'."""
    return {"version": 1, "disable_existing_loggers": False}
