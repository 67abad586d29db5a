"""Config reload plans (api/reload.py): what applies live (the responses store's caps, the model
fields read at each request) and what needs a restart."""

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


def _models(**fields) -> dict:
    return {"models": [{"name": "m", "path": "m.gguf", **fields}, {"name": "n", "path": "n.gguf"}]}


def test_fields_read_at_each_request_apply_live_and_the_rest_wait_for_a_restart():
    old = parse_config(_models())
    plan = plan_reload(old, parse_config(_models(reasoning_budget=64, reasoning_budget_message="Answer now.",
                                                 chat_template_kwargs={"enable_thinking": False})))
    assert plan.restart_required == []
    assert plan.applied == ["models.m.reasoning_budget", "models.m.reasoning_budget_message",
                            "models.m.chat_template_kwargs"]
    m = plan.config.model("m")
    assert (m.reasoning_budget, m.reasoning_budget_message) == (64, "Answer now.")
    plan = plan_reload(old, parse_config(_models(reasoning_budget=64, n_ctx=1024)))
    assert plan.restart_required == ["models.m"] and plan.applied == []
    assert plan.config.model("m") == old.model("m")  # kept whole until the restart


def test_lora_scales_apply_live_and_adapters_added_or_removed_wait_for_a_restart():
    tuned = {"name": "m-tuned", "path": "t.gguf"}
    old = parse_config(_models(lora=[tuned, {"name": "m-terse", "path": "s.gguf", "scale": 0.5}]))
    plan = plan_reload(old, parse_config(_models(lora=[{**tuned, "scale": -0.25},
                                                       {"name": "m-terse", "path": "s.gguf", "scale": 0.5}])))
    assert plan.restart_required == [] and plan.applied == ["models.m.lora[0].scale"]
    assert [a.scale for a in plan.config.model("m").lora] == [-0.25, 0.5]
    assert plan.config.adapter("m-tuned")[0].lora[0].scale == -0.25  # what a request by the name gets
    for changed in ([tuned], [{**tuned, "path": "other.gguf"}], [{**tuned, "name": "m-x"}, old.model("m").lora[1]]):
        raw = [a if isinstance(a, dict) else {"name": a.name, "path": a.path, "scale": a.scale} for a in changed]
        plan = plan_reload(old, parse_config(_models(lora=raw)))
        assert plan.restart_required == ["models.m"] and plan.config.model("m") == old.model("m"), raw
