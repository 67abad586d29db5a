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


def test_file_caps_and_batch_concurrency_apply_live_and_preemption_waits():
    # (they fell through both lists: a reload said nothing had changed and kept the old caps)
    old = parse_config(_config())
    new = parse_config({**_config(), "server": {"files": {"max_mb": 1, "max_file_mb": 1},
                                                "batches": {"concurrent_requests": 5, "preempt": False}}})
    plan = plan_reload(old, new)
    assert plan.applied == ["server.files", "server.batches.concurrent_requests"]
    assert plan.restart_required == ["server.batches.preempt"]
    server = plan.config.server
    assert (server.files.max_mb, server.files.max_file_mb, server.batches.concurrent_requests) == (1, 1, 5)
    assert server.batches.preempt is True


def test_a_model_added_under_a_new_model_dir_waits_for_the_restart(tmp_path):
    # run with the old model_dir, its relative path named another file (or none)
    old = parse_config({"model_dir": str(tmp_path / "a"), **_models()})
    new = {"model_dir": str(tmp_path / "b"), "models": _models()["models"] + [{"name": "o", "path": "o.gguf"}]}
    plan = plan_reload(old, parse_config(new))
    assert plan.added_models == [] and plan.config.model("o") is None
    assert {"models.o (added under the new model_dir)", "model_dir"} <= set(plan.restart_required)
    plan = plan_reload(old, parse_config({**new, "model_dir": str(tmp_path / "a")}))
    assert plan.added_models == ["o"] and plan.restart_required == []


def test_cors_origins_apply_live():
    plan = plan_reload(parse_config(_config()), parse_config({**_config(), "server": {"cors_origins": ["*"]}}))
    assert plan.applied == ["server.cors_origins"] and plan.config.server.cors_origins == ["*"]
