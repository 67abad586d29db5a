from __future__ import annotations

import msgspec

from appliance.api import openapi
from appliance.api.app import App


class _Manager:  # what App's constructor touches
    runners: dict = {}

    async def ready_runner(self, name: str):
        raise KeyError(name)


def test_openapi_lists_every_route_of_the_app_with_its_schemas():
    from appliance.config import parse_config

    config = parse_config({"models": [{"name": "a", "path": "a.gguf"}]})
    app = App(config, _Manager())  # type: ignore[arg-type]
    doc = openapi.build()
    served = {(m.lower(), p) for p, methods in app.routes.items() for m in methods}
    described = {(m, p) for p, methods in doc["paths"].items() for m in methods}
    assert served == described
    schemas = doc["components"]["schemas"]
    for name in ("ChatRequest", "CompletionRequest", "GroupRequest", "ChatCompletion", "ErrorEnvelope",
                 "KvConvert", "ModelAction"):
        assert name in schemas, name
    # every $ref resolves
    refs = set()

    def walk(x):
        if isinstance(x, dict):
            if "$ref" in x:
                refs.add(x["$ref"].rsplit("/", 1)[-1])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    assert refs <= set(schemas)
    msgspec.json.encode(doc)
    from appliance.engine import client

    client.remove_tap(app._tap)
