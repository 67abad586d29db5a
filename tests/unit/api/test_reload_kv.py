"""Config reload and inference.kv_cache: a changed default reaches the models it applies to."""

from __future__ import annotations

from appliance.api.reload import plan_reload
from appliance.config import parse_config


def _config(default: str, **extra) -> dict:
    return {"inference": {"kv_cache": {"mode": default}},
            "models": [{"name": "inherits", "path": "m.gguf"},
                       {"name": "own", "path": "m.gguf", "kv_cache": {"mode": "q8_0"}}], **extra}


def test_a_changed_default_needs_a_restart_of_the_models_that_inherit_it():
    plan = plan_reload(parse_config(_config("auto")), parse_config(_config("turbo3")))
    assert plan.restart_required == ["models.inherits"]
    assert plan.config.model("inherits").kv_cache.mode == "auto"  # kept until the restart


def test_a_new_budget_applies_live_so_auto_is_decided_again():
    plan = plan_reload(parse_config(_config("auto")), parse_config(_config("auto", vram={"budget_mb": 512})))
    assert plan.applied == ["vram"] and plan.restart_required == []
    assert plan.config.vram.budget_mb == 512
