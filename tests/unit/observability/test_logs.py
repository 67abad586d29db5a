from __future__ import annotations

import io
import json
import logging

from appliance.observability import context
from appliance.observability.logs import JsonFormatter


def test_json_lines_carry_the_request_id_and_extra_fields():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("eie.test.logs")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    token = context.current.set(context.RequestInfo("req-123", "POST", "/v1/x"))
    try:
        log.info("hello %s", "world", extra={"status": 200})
    finally:
        context.current.reset(token)
    log.info("outside")
    first, second = (json.loads(x) for x in stream.getvalue().splitlines())
    assert first["msg"] == "hello world" and first["request_id"] == "req-123" and first["status"] == 200
    assert first["level"] == "info" and first["logger"] == "eie.test.logs"
    assert "request_id" not in second


def test_request_ids_from_clients_are_kept_only_when_sane():
    assert context.request_id("abc-123") == "abc-123"
    assert context.request_id(None) != context.request_id(None)
    bad = context.request_id("x" * 500)
    assert len(bad) == 32
    assert context.request_id("a\nb") != "a\nb"
