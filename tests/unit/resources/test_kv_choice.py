"""kv_cache.mode auto: the choice of KV types against the budget, on tiny made-up model shapes.

The shapes have no weights and no compute buffer, so a model's estimate is its KV cache alone:
256 cells of 4 KV heads × (64 K + 64 V) values, 1024 bytes a cell at f16.
"""

from __future__ import annotations

import pytest

from appliance.config import parse_config
from appliance.resources.estimate import GgufShape, estimate
from appliance.resources.kv_choice import KvInput, choose_kv, ladder

BUDGET = "the device budget of 1 MiB after the 85% low watermark"
F16, Q8, TURBO4, TURBO3, TURBO2, Q4 = 262144, 139264, 71680, 57344, 40960, 73728  # KV bytes of `shape()`


def shape(n_head: int = 4, n_head_kv: int = 4) -> GgufShape:
    return GgufShape(architecture="test", n_layer=1, n_embd=0, n_ff=0, n_head=n_head, n_head_kv=n_head_kv,
                     key_length=64, value_length=64, n_vocab=0, tensor_bytes=0)


def models(*entries: dict, shapes: dict | None = None) -> list[KvInput]:
    cfg = parse_config({"models": [{"path": "m.gguf", "n_ctx": 256, "n_parallel": 1, "n_batch": 32, **e}
                                   for e in entries]})
    shapes = shapes or {}
    return [KvInput(m, shapes.get(m.name, shape())) for m in cfg.models]


AUTO = {"name": "a", "kv_cache": {"mode": "auto"}}


def test_the_made_up_shape_has_the_sizes_the_tests_assume():
    m = models(AUTO)[0]
    sizes = [estimate(m.shape, m.cfg, t, t).total for t in ("f16", "q8_0", "turbo4", "turbo3", "turbo2", "q4_0")]
    assert sizes == [F16, Q8, TURBO4, TURBO3, TURBO2, Q4]


@pytest.mark.parametrize("usable,expected,above", [
    (F16, "f16", None),
    (F16 - 1, "q8_0", "f16"),
    (Q8, "q8_0", "f16"),
    (TURBO4 - 1, "turbo3", "f16, q8_0, turbo4"),
    (TURBO2, "turbo2", "f16, q8_0, turbo4, turbo3"),
])
def test_one_auto_model_takes_the_least_compressed_type_that_fits(usable, expected, above):
    c = choose_kv(models(AUTO), usable, BUDGET)["a"]
    assert (c.type_k, c.type_v, c.configured, c.fits) == (expected, expected, "auto", True)
    if above is None:
        assert c.reason == f"f16: the 1 model fits {BUDGET} (256 KiB needed)"
    else:
        assert c.reason.startswith(f"{expected}: {above} exceed {BUDGET} with 1 model ({expected} brings it to")
    if expected.startswith("turbo"):
        assert c.reason.endswith("; GQA 1 < 6 so K follows V")


def test_a_draft_models_memory_counts_against_the_budget():
    alone = models(AUTO)[0]
    with_draft = KvInput(alone.cfg, alone.shape, extra_bytes=F16 - Q8)  # a draft as big as f16 saves over q8_0
    assert choose_kv([alone], F16, BUDGET)["a"].type_v == "f16"
    assert choose_kv([with_draft], F16, BUDGET)["a"].type_v == "q8_0"


def test_gqa_of_6_or_more_keeps_k_at_q8_0_past_q8_0():
    gqa6 = shape(n_head=12, n_head_kv=2)  # 512 bytes a cell at f16
    inputs = models(AUTO, shapes={"a": gqa6})
    assert ladder(inputs[0].cfg, gqa6, turbo_ok=True) == [
        ("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "turbo4"), ("q8_0", "turbo3"), ("q8_0", "turbo2")]
    # K q8_0 + V turbo4: 2 heads × (68 + 35) bytes × 256 cells = 52736; with V turbo3: 49152.
    c = choose_kv(inputs, 50000, BUDGET)["a"]
    assert (c.type_k, c.type_v) == ("q8_0", "turbo3")
    assert c.reason.startswith(f"q8_0/turbo3: f16, q8_0, q8_0/turbo4 exceed {BUDGET}")
    assert c.reason.endswith("; GQA 6 ≥ 6 so K stays q8_0")


def test_a_configured_k_stays_while_v_steps_down():
    c = choose_kv(models({"name": "a", "kv_cache": {"mode": "auto", "k": "q8_0"}}), 70000, BUDGET)["a"]
    assert (c.type_k, c.type_v) == ("q8_0", "turbo2")
    assert c.reason.endswith("; K set to q8_0 by kv_cache.k")


def test_when_nothing_fits_auto_takes_the_last_rung_and_says_so():
    c = choose_kv(models(AUTO), 1000, BUDGET)["a"]
    assert (c.type_k, c.type_v, c.fits) == ("turbo2", "turbo2", False)
    assert c.reason.startswith(f"turbo2: nothing fits {BUDGET} with 1 model: it needs 40 KiB even with every auto "
                               "model at its last rung; loading is left to the budget checks")


def test_the_auto_model_with_the_largest_kv_steps_first_and_explicit_types_stay():
    inputs = models(
        {"name": "big", "kv_cache": {"mode": "auto"}, "n_ctx": 1024},  # 4 × the KV of the others
        {"name": "small", "kv_cache": {"mode": "auto"}},
        {"name": "fixed", "kv_cache": {"mode": "turbo4", "k": "q8_0"}},
    )
    fixed = estimate(inputs[2].shape, inputs[2].cfg).total
    # big at q8_0 (4 × Q8) and small at f16 fit exactly.
    choices = choose_kv(inputs, 4 * Q8 + F16 + fixed, BUDGET)
    assert [(c.type_k, c.type_v) for c in choices.values()] == [("q8_0", "q8_0"), ("f16", "f16"), ("q8_0", "turbo4")]
    assert choices["small"].reason.startswith(f"f16: the 3 models fit {BUDGET}")
    assert choices["small"].reason.endswith(" once big stepped down")
    assert choices["fixed"].reason == "q8_0/turbo4: configured"
    assert choices["big"].reason.startswith(f"q8_0: f16 exceed {BUDGET} with 3 models")


@pytest.mark.parametrize("usable", range(2 * TURBO2, 2 * F16 + 1, 9973))
def test_every_stepped_model_would_not_fit_one_rung_up(usable):
    """Largest-first stepping can overshoot; the raise-back pass leaves nothing that could go up."""
    inputs = models(AUTO, {"name": "b", "kv_cache": {"mode": "auto"}})
    choices = choose_kv(inputs, usable, BUDGET)
    kv = {m.cfg.name: m for m in inputs}
    total = sum(estimate(kv[n].shape, kv[n].cfg, c.type_k, c.type_v).total for n, c in choices.items())
    assert total <= usable
    for name, c in choices.items():
        rungs = ladder(kv[name].cfg, kv[name].shape, True)
        i = rungs.index((c.type_k, c.type_v))
        if i:
            up = total - estimate(kv[name].shape, kv[name].cfg, c.type_k, c.type_v).total + estimate(
                kv[name].shape, kv[name].cfg, *rungs[i - 1]).total
            assert up > usable, (name, c)


def test_on_a_gpu_build_auto_stops_at_q4_0():
    c = choose_kv(models(AUTO), Q4, BUDGET, gpu="CUDA")["a"]
    assert (c.type_k, c.type_v, c.fits) == ("q4_0", "q4_0", True)
    assert c.reason.endswith("; turbo types skipped: this build offloads to CUDA, which has no TurboQuant kernels")
    c = choose_kv(models(AUTO), TURBO2, BUDGET, gpu="CUDA")["a"]
    assert (c.type_v, c.fits) == ("q4_0", False)


MIB = 2**20
# Two layers of 512 KiB, an output layer of 512 KiB on the GPU, and 1.5 MiB of token embeddings
# that stay in host memory; KV at f16 is 2 × F16 (two layers).
OFFLOADABLE = GgufShape(architecture="test", n_layer=2, n_embd=0, n_ff=0, n_head=4, n_head_kv=4, key_length=64,
                        value_length=64, n_vocab=0, tensor_bytes=3 * MIB, block_bytes=(MIB // 2, MIB // 2),
                        output_bytes=MIB // 2)


def test_on_a_gpu_auto_counts_what_the_gpu_holds_not_the_embeddings_left_on_the_host():
    gpu_part = 3 * MIB // 2 + 2 * F16
    inputs = models(AUTO, shapes={"a": OFFLOADABLE})
    on_gpu = choose_kv(inputs, gpu_part, BUDGET, gpu="CUDA")["a"]
    assert (on_gpu.type_v, on_gpu.fits) == ("f16", True)
    assert on_gpu.reason == f"f16: the 1 model fits {BUDGET} (2 MiB needed)"
    assert choose_kv(inputs, gpu_part - 1, BUDGET, gpu="CUDA")["a"].type_v == "q8_0"
    # The same budget on the CPU holds every byte of the model: no KV type makes it fit.
    on_cpu = choose_kv(inputs, gpu_part, BUDGET)["a"]
    assert (on_cpu.type_v, on_cpu.fits) == ("turbo2", False)


def test_on_a_gpu_a_configured_layer_count_counts_those_layers_and_a_draft_model_counts_whole():
    inputs = models({**AUTO, "n_gpu_layers": 2}, shapes={"a": OFFLOADABLE})
    one_layer = MIB // 2 + MIB // 2 + F16  # the output layer, then the last layer and its KV
    assert choose_kv(inputs, one_layer, BUDGET, gpu="CUDA")["a"].type_v == "f16"
    assert choose_kv(inputs, one_layer - 1, BUDGET, gpu="CUDA")["a"].type_v == "q8_0"
    drafted = [KvInput(inputs[0].cfg, OFFLOADABLE, extra_bytes=1000)]
    assert choose_kv(drafted, one_layer + 1000, BUDGET, gpu="CUDA")["a"].type_v == "f16"
    assert choose_kv(drafted, one_layer + 999, BUDGET, gpu="CUDA")["a"].type_v == "q8_0"


def test_without_turbo_types_in_the_build_auto_stops_at_q4_0():
    c = choose_kv(models(AUTO), TURBO2, BUDGET, turbo_built=False)["a"]
    assert (c.type_v, c.fits) == ("q4_0", False)
    assert "this llama.cpp build has no TurboQuant KV types" in c.reason


def test_an_explicit_turbo_type_on_a_gpu_build_is_flagged():
    c = choose_kv(models({"name": "t", "kv_cache": {"mode": "turbo3"}}), None, BUDGET, gpu="CUDA")["t"]
    assert (c.type_v, c.configured) == ("turbo3", "turbo3")
    assert c.reason == ("turbo3: configured; turbo3 KV cache has no CUDA kernels in this build, so the load fails; "
                        "use q8_0/q4_0 or run on CPU")


def test_an_unreadable_header_leaves_auto_at_f16():
    inputs = [KvInput(m.cfg, None, "model file not found: m.gguf") for m in models(AUTO)]
    c = choose_kv(inputs, 1, BUDGET)["a"]
    assert (c.type_v, c.reason) == ("f16", "f16: the GGUF header could not be read (model file not found: m.gguf); "
                                           "the load reports why")


def test_an_encoder_takes_no_kv_cache_from_the_budget():
    """A sentence encoder (llama.cpp's `bert` and kin) has no KV cache: whatever its types, it
    leaves the whole budget to the others (as an embedding model of any other architecture would
    hold one decode's cells: 32 here)."""
    bert = GgufShape(**{**shape().__dict__, "architecture": "bert"})
    encoder = {"name": "enc", "kv_cache": {"mode": "auto"}, "embedding": True}
    inputs = models(AUTO, encoder, shapes={"enc": bert})
    assert {estimate(bert, inputs[1].cfg, t, t).kv for t in ("f16", "q8_0", "turbo2")} == {0}
    assert choose_kv(inputs, F16, BUDGET)["a"].type_v == "f16"
    decoder = models(AUTO, encoder)
    assert estimate(decoder[1].shape, decoder[1].cfg, "f16", "f16").kv == 32 * 1024
    assert choose_kv(decoder, F16, BUDGET)["a"].type_v == "q8_0"


def test_without_flash_attention_only_k_steps_down():
    # llama.cpp refuses a quantized V without flash attention: an adaptive model stepping down to
    # q8_0 V tore its context down and made it again at every cooldown, for good
    plain = models({"name": "a", "flash_attn": "off", "kv_cache": {"adaptive": True}})[0]
    assert ladder(plain.cfg, plain.shape, turbo_ok=True) == [("f16", "f16"), ("q8_0", "f16")]
    asymmetric = models({"name": "a", "flash_attn": "off", "kv_cache": {"k": "q8_0"}})[0]
    assert ladder(asymmetric.cfg, asymmetric.shape, turbo_ok=True) == [("q8_0", "f16")]
