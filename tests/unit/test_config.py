"""Config validation: one message per problem, each naming its key path and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
GOOD_MODEL = {"name": "m", "path": "m.gguf"}


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    return e.value.problems


@pytest.mark.parametrize(
    "raw,expected",
    [
        ({"models": [{**GOOD_MODEL, "n_ctx": "big"}]}, 'models[0].n_ctx: expected int >= 256 and <= 1048576, got "big"'),
        ({"models": [GOOD_MODEL, {**GOOD_MODEL, "n_ctx": 100}]}, "models[1].n_ctx: expected int >= 256 and <= 1048576, got 100"),
        ({"models": [{**GOOD_MODEL, "kv_cache": {"mode": "q9"}}]}, 'models[0].kv_cache.mode: expected one of'),
        ({"models": [{**GOOD_MODEL, "flash_attn": "maybe"}]}, 'models[0].flash_attn: expected one of auto, off, on, got "maybe"'),
        ({"models": [{**GOOD_MODEL, "colour": "red"}]}, "models[0].colour: unknown key (allowed:"),
        ({"models": [GOOD_MODEL], "sever": {}}, "sever: unknown key (allowed: audit, groups, inference, model_dir, models, policy, server, vram)"),
        ({"models": []}, "models: expected at least 1 item(s), got 0"),
        ({}, "models: required key is missing"),
        ({"models": [{"path": "x.gguf"}]}, "models[0].name: required key is missing"),
        ({"models": [GOOD_MODEL, GOOD_MODEL]}, 'models[1].name: duplicate model name "m" (also models[0])'),
        ({"models": [GOOD_MODEL], "groups": [{"name": "m", "models": ["m"]}]}, 'groups[0].name: "m" is also a model\'s name'),
        ({"models": [GOOD_MODEL], "server": {"port": 70000}}, "server.port: expected int >= 1 and <= 65535, got 70000"),
        ({"models": [GOOD_MODEL], "server": {"port": True}}, "server.port: expected int >= 1 and <= 65535, got true"),
        ({"models": [GOOD_MODEL], "server": {"api_keys": ["short"]}}, 'server.api_keys[0]: expected string (at least 8 characters), got "short"'),
        ({"models": [GOOD_MODEL], "server": {"limits": {"request_timeout_s": 0}}}, "server.limits.request_timeout_s: expected number > 0"),
        ({"models": [GOOD_MODEL], "policy": {"strategy": "lru"}}, 'policy.strategy: expected one of generic, pinned-group, multi-group, fixed-appliance, plugin:<file.so>, plugin:<module>:<Class>, got "lru"'),
        ({"models": [{**GOOD_MODEL, "name": "bad name!"}]}, "models[0].name: expected string"),
        ({"models": [{**GOOD_MODEL, "flash_attn": "off", "kv_cache": {"mode": "q8_0"}}]}, "models[0].kv_cache.mode: a quantized V cache (q8_0) needs flash attention"),
        ({"models": {"name": "m"}}, "models: expected list of mapping"),
        ({"models": [{**GOOD_MODEL, "n_parallel": 0}]}, "models[0].n_parallel: expected int >= 1 and <= 256, got 0"),
        ({"models": [{**GOOD_MODEL, "n_ctx": 256, "n_parallel": 1, "n_batch": 1024}]}, "models[0].n_batch: must not exceed n_ctx * n_parallel (256)"),
        ({"models": [{**GOOD_MODEL, "pooling": "rank"}]}, 'models[0].pooling: "rank" pools an embedding model\'s token states; set models[0].embedding: true, or leave pooling out'),
        ({"models": [{**GOOD_MODEL, "embedding": True, "pooling": "max"}]}, 'models[0].pooling: expected one of auto, cls, last, mean, rank, got "max"'),
        ({"models": [GOOD_MODEL], "inference": {"kv_cache": {"mode": "turbo5"}}}, 'inference.kv_cache.mode: expected one of auto, bf16, f16, f32, iq4_nl, q4_0, q4_1, q5_0, q5_1, q8_0, turbo2, turbo3, turbo4, got "turbo5"'),
        ({"models": [GOOD_MODEL], "inference": {"kv_cache": {"k": "auto"}}}, 'inference.kv_cache.k: expected one of bf16, f16, f32, iq4_nl, q4_0, q4_1, q5_0, q5_1, q8_0, turbo2, turbo3, turbo4, got "auto"'),
        ({"models": [GOOD_MODEL], "inference": {"kv_cache": {"adaptive": "yes"}}}, 'inference.kv_cache.adaptive: expected bool (true or false), got "yes"'),
        ({"models": [GOOD_MODEL], "inference": {"kv_cache": {"modes": "auto"}}}, "inference.kv_cache.modes: unknown key (allowed: adaptive, center_k, disk, k, max_decode_ms, mode, prefix, sliding_window)"),
        ({"models": [GOOD_MODEL], "inference": {"kv": {}}}, "inference.kv: unknown key (allowed: kv_adaptive, kv_cache, speculative)"),
        ({"models": [GOOD_MODEL], "inference": {"kv_cache": None}}, "inference.kv_cache: expected a mapping, got null"),
        ({"models": [{**GOOD_MODEL, "kv_cache": {"adaptive": 1}}]}, "models[0].kv_cache.adaptive: expected bool (true or false), got 1"),
        ({"models": [{**GOOD_MODEL, "flash_attn": "off", "kv_cache": {"mode": "auto"}}]}, "models[0].kv_cache.mode: auto may choose a quantized V cache, which needs flash attention"),
        ({"models": [{**GOOD_MODEL, "flash_attn": "off"}], "inference": {"kv_cache": {"mode": "turbo3"}}}, "models[0].flash_attn: off, but inference.kv_cache.mode (turbo3) applies to this model"),
    ],
)
def test_each_mistake_is_reported_by_key_path(raw, expected):
    found = problems(raw)
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize("name", [["smol"], {"a": 1}])
def test_a_model_name_of_another_type_is_named_not_a_crash(name):
    found = problems({"models": [{**GOOD_MODEL, "name": name}],
                      "groups": [{"name": "g", "models": [name, "m"]}]})
    assert any(p.startswith("models[0].name: expected string") for p in found), found


@pytest.mark.parametrize("n_parallel", ["x", None, [1], True])
def test_a_bad_n_parallel_beside_n_batch_is_named_not_a_crash(n_parallel):
    found = problems({"models": [{**GOOD_MODEL, "n_batch": 64, "n_parallel": n_parallel}]})
    assert any(p.startswith("models[0].n_parallel: expected int >= 1") for p in found), found
    assert not any(p.startswith("models[0].n_batch") for p in found), found


def test_group_pools_charge_a_model_once_and_fit_the_device_budget():
    models = [{**GOOD_MODEL, "name": "a"}, {**GOOD_MODEL, "name": "b"}]
    raw = {"models": models, "policy": {"strategy": "multi-group"}, "vram": {"budget_mb": 300},
           "groups": [{"name": "ga", "models": ["a"], "budget_mb": 290, "pinned": True},
                      {"name": "gb", "models": ["b", "a"], "budget_mb": 400}]}
    found = problems(raw)
    assert any(p.startswith("groups[1].models[1]: 'a' is in groups[0]'s memory pool already") for p in found), found
    assert any(p.startswith("groups: the groups' budget_mb add up to 690 MiB, more than vram.budget_mb (300)")
               for p in found), found
    # without isolation the budgets are not pools: nothing to check
    parse_config({**raw, "policy": {"strategy": "generic"}})
    parse_config({**raw, "vram": {"budget_mb": 700, "group_isolation": True}, "policy": {"strategy": "generic"},
                  "groups": [raw["groups"][0], {**raw["groups"][1], "models": ["b"]}]})


def test_all_problems_are_reported_at_once():
    raw = {
        "models": [{"name": "a", "path": "", "n_ctx": "big", "threads": -1}, {"name": "a", "path": "b"}],
        "server": {"port": 0},
        "extra": 1,
    }
    found = problems(raw)
    assert len(found) == 6, found


def test_top_level_must_be_a_mapping():
    assert problems(["models"]) == ['(top level): expected a mapping, got ["models"]']


def test_a_key_given_twice_is_refused_with_its_lines(tmp_path):
    # (PyYAML keeps the last: a repeated server section dropped the first, state_dir and all)
    path = tmp_path / "dup.yaml"
    path.write_text("server: {state_dir: /srv/eie}\nmodels:\n  - {name: m, path: m.gguf}\nserver: {port: 8081}\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'server' \(also on line 1\)"):
        load_config(path)
    path.write_text("models:\n  - {name: m, path: m.gguf, n_ctx: 512, n_ctx: 4096}\n")
    with pytest.raises(ConfigError, match="duplicate key 'n_ctx'"):
        load_config(path)


def test_yaml_syntax_error_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_defaults_and_relative_model_paths(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("model_dir: models\nmodels:\n  - {name: m, path: m.gguf}\n")
    cfg = load_config(cfg_file)
    m = cfg.models[0]
    assert (m.n_ctx, m.n_parallel, m.kv_cache.type_k, m.kv_cache.type_v, m.flash_attn) == (4096, 4, "f16", "f16", "auto")
    assert cfg.model_path(m) == tmp_path / "models" / "m.gguf"
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 8080


def test_asymmetric_kv_override():
    cfg = parse_config({"models": [{**GOOD_MODEL, "kv_cache": {"mode": "q8_0", "k": "f16"}}]})
    assert cfg.models[0].kv_cache.type_k == "f16" and cfg.models[0].kv_cache.type_v == "q8_0"


def test_inference_kv_cache_is_every_models_default_overridden_key_by_key():
    cfg = parse_config({
        "inference": {"kv_cache": {"mode": "auto", "k": "q8_0", "adaptive": True}},
        "models": [
            {"name": "inherits", "path": "m.gguf"},
            {"name": "own-mode", "path": "m.gguf", "kv_cache": {"mode": "turbo3"}},
            {"name": "own-all", "path": "m.gguf", "kv_cache": {"mode": "f16", "k": None, "adaptive": False}},
        ],
    })
    kv = {m.name: m.kv_cache for m in cfg.models}
    assert (kv["inherits"].mode, kv["inherits"].k, kv["inherits"].adaptive) == ("auto", "q8_0", True)
    assert (kv["own-mode"].type_k, kv["own-mode"].type_v, kv["own-mode"].adaptive) == ("q8_0", "turbo3", True)
    assert (kv["own-all"].type_k, kv["own-all"].type_v, kv["own-all"].adaptive) == ("f16", "f16", False)
    assert cfg.inference.kv_cache.mode == "auto"


def test_without_inference_section_models_keep_their_defaults():
    cfg = parse_config({"models": [GOOD_MODEL, {**GOOD_MODEL, "name": "n", "kv_cache": {"mode": "q4_0"}}]})
    assert cfg.inference.kv_cache.mode == "f16" and cfg.inference.kv_cache.adaptive is False
    assert [(m.kv_cache.type_k, m.kv_cache.type_v, m.kv_cache.adaptive) for m in cfg.models] == [
        ("f16", "f16", False), ("q4_0", "q4_0", False)]


def test_flash_attn_off_is_fine_when_the_model_keeps_f16_over_a_quantized_default():
    cfg = parse_config({"inference": {"kv_cache": {"mode": "q8_0"}},
                        "models": [{**GOOD_MODEL, "flash_attn": "off", "kv_cache": {"mode": "f16"}}]})
    assert cfg.models[0].kv_cache.type_v == "f16"


@pytest.mark.parametrize("preset", sorted((ROOT / "presets").glob("*.yaml")), ids=lambda p: p.name)
def test_presets_are_valid_and_point_at_installed_models(preset):
    cfg = load_config(preset)
    for m in cfg.models:
        assert cfg.model_path(m).is_file(), f"{preset.name}: {m.name} -> {cfg.model_path(m)}"


def test_state_and_cache_dirs_come_from_config_then_eie_env_then_systemd_env(tmp_path, monkeypatch):
    for var in ("EIE_STATE_DIR", "EIE_CACHE_DIR", "STATE_DIRECTORY", "CACHE_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    raw = {"models": [{"name": "a", "path": "a.gguf"}]}
    cfg = parse_config(raw, source_dir=str(tmp_path))
    assert cfg.state_dir() == Path.home() / ".local" / "state" / "eie"
    assert cfg.kv_disk_dir(cfg.models[0]) == Path.home() / ".cache" / "eie" / "kv"
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/eie:/var/lib/other")  # systemd's list
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/eie")
    assert cfg.state_dir() == Path("/var/lib/eie")
    assert cfg.kv_disk_dir(cfg.models[0]) == Path("/var/cache/eie/kv")
    monkeypatch.setenv("EIE_STATE_DIR", "/srv/state")
    monkeypatch.setenv("EIE_CACHE_DIR", "/srv/cache")
    assert cfg.state_dir() == Path("/srv/state") and cfg.cache_dir() == Path("/srv/cache")
    cfg = parse_config({**raw, "server": {"state_dir": "st", "cache_dir": "ca"}}, source_dir=str(tmp_path))
    assert cfg.state_dir() == tmp_path / "st" and cfg.kv_disk_dir(cfg.models[0]) == tmp_path / "ca" / "kv"


LORA = {"name": "m-tuned", "path": "tuned.gguf"}


@pytest.mark.parametrize(
    "raw,expected",
    [
        ({"models": [{**GOOD_MODEL, "lora": [{**LORA, "name": "m"}]}]},
         'models[0].lora[0].name: "m" is also a model\'s name'),
        ({"models": [{**GOOD_MODEL, "lora": [LORA]}, {"name": "n", "path": "n.gguf", "lora": [LORA]}]},
         'models[1].lora[0].name: duplicate adapter name "m-tuned" (also models[0].lora[0].name)'),
        ({"models": [{**GOOD_MODEL, "lora": [{**LORA, "scale": 20}]}]},
         "models[0].lora[0].scale: expected number >= -16 and <= 16, got 20"),
        ({"models": [{**GOOD_MODEL, "lora": [{"name": "x"}]}]}, "models[0].lora[0].path: required key is missing"),
        ({"models": [{**GOOD_MODEL, "embedding": True, "lora": [LORA]}]},
         "models[0].lora: an embedding model serves no adapters"),
        ({"models": [{**GOOD_MODEL, "lora": [LORA]}], "groups": [{"name": "m-tuned", "models": ["m"]}]},
         'groups[0].name: "m-tuned" is also a model\'s name'),
        ({"models": [GOOD_MODEL], "groups": [{"name": "g", "models": ["m", "m-tuned"]}]},
         'groups[0].models[1]: unknown model "m-tuned"'),
    ],
)
def test_lora_problems(raw, expected):
    assert any(p.startswith(expected) for p in problems(raw)), problems(raw)


def test_lora_adapters_are_served_names():
    config = parse_config({"models": [{**GOOD_MODEL, "lora": [LORA, {"name": "m-half", "path": "/a/t.gguf", "scale": 0.5}]}],
                           "groups": [{"name": "g", "models": ["m", "m-tuned"], "pinned": True}],
                           "policy": {"strategy": "pinned-group"}})
    assert config.base_of("m-half") == "m" and config.base_of("m") == "m" and config.base_of("other") == "other"
    model, index = config.adapter("m-half")
    assert model.name == "m" and index == 1 and model.lora[1].scale == 0.5
    assert str(config.adapter_path(model.lora[1])) == "/a/t.gguf"
    assert config.adapter_path(model.lora[0]) == config.model_base() / "tuned.gguf"


CVEC = {"path": "happy.gguf"}


@pytest.mark.parametrize(
    "raw,expected",
    [
        ({"models": [{**GOOD_MODEL, "control_vectors": [{}]}]}, "models[0].control_vectors[0].path: required key is missing"),
        ({"models": [{**GOOD_MODEL, "control_vectors": [{**CVEC, "scale": 2000}]}]},
         "models[0].control_vectors[0].scale: expected number >= -1000 and <= 1000, got 2000"),
        ({"models": [{**GOOD_MODEL, "control_vectors": [CVEC], "control_vector_layers": [0, 3]}]},
         "models[0].control_vector_layers[0]: expected int >= 1"),
        ({"models": [{**GOOD_MODEL, "control_vectors": [CVEC], "control_vector_layers": [4]}]},
         "models[0].control_vector_layers: expected at least 2 item(s), got 1"),
        ({"models": [{**GOOD_MODEL, "control_vectors": [CVEC], "control_vector_layers": [1, 2, 3]}]},
         "models[0].control_vector_layers: expected at most 2 item(s), got 3"),
        ({"models": [{**GOOD_MODEL, "control_vectors": [CVEC], "control_vector_layers": [9, 3]}]},
         "models[0].control_vector_layers: the first layer (9) is after the last (3)"),
        ({"models": [{**GOOD_MODEL, "control_vector_layers": [1, 3]}]},
         "models[0].control_vector_layers: bounds the layers control_vectors act on; set control_vectors"),
        ({"models": [{**GOOD_MODEL, "embedding": True, "control_vectors": [CVEC]}]},
         "models[0].control_vectors: an embedding model is not steered"),
    ],
)
def test_control_vector_problems(raw, expected):
    assert any(p.startswith(expected) for p in problems(raw)), problems(raw)


def test_control_vector_files_resolve_under_model_dir():
    config = parse_config({"models": [{**GOOD_MODEL, "control_vectors": [CVEC, {"path": "/a/sad.gguf", "scale": -0.5}],
                                       "control_vector_layers": [2, 5]}]})
    model = config.models[0]
    assert config.control_files(model) == [(config.model_base() / "happy.gguf", 1.0), (Path("/a/sad.gguf"), -0.5)]
    assert model.control_vector_layers == [2, 5]
