"""Config reload and server.responses: the store's caps apply live, where it writes needs a restart."""

from __future__ import annotations

from appliance.api.reload import plan_reload
from appliance.config import parse_config


def _config(**responses) -> dict:
    return {"server": {"responses": responses}, "models": [{"name": "m", "path": "m.gguf"}]}


def test_the_caps_apply_live():
    plan = plan_reload(parse_config(_config()), parse_config(_config(max_entries=5, max_mb=2)))
    assert plan.applied == ["server.responses"] and plan.restart_required == []
    assert (plan.config.server.responses.max_entries, plan.config.server.responses.max_mb) == (5, 2)


def test_persisting_or_not_waits_for_a_restart():
    plan = plan_reload(parse_config(_config()), parse_config(_config(persist=False, max_entries=5)))
    assert plan.restart_required == ["server.responses.persist"]
    assert plan.config.server.responses.persist is True and plan.config.server.responses.max_entries == 5
