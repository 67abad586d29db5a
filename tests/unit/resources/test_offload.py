"""How much of a model a GPU holds (resources/offload.py): the layer table read from the real
GGUFs, the GPU's part for each layer count, the most layers that fit, and llama.cpp's buffer
lines split between GPU and host memory."""

from __future__ import annotations

import msgspec
import pytest

from appliance.config import ModelConfig
from appliance.engine import gguf_tensors, native
from appliance.engine.manager import shape_of
from appliance.resources import offload
from appliance.resources.estimate import Estimate, estimate
from conftest import GEMMA3, SMOLLM2

MIB = 1 << 20


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_the_layer_table_accounts_for_every_tensor(real_models, tmp_path, path):
    shape = shape_of(path, tmp_path)
    sizes = gguf_tensors.sizes(gguf_tensors.table(path))
    assert len(shape.block_bytes) == shape.n_layer > 0 and all(shape.block_bytes)
    # both models tie their output to the token embeddings: the GPU gets a copy of them
    assert shape.tied_output_bytes == sizes["token_embd.weight"]
    assert shape.output_bytes == sizes["token_embd.weight"] + sizes["output_norm.weight"]
    assert sum(shape.block_bytes) + sizes["token_embd.weight"] + sizes["output_norm.weight"] == sum(sizes.values())


def test_a_table_that_is_not_the_models_layers_is_not_used():
    assert offload.layer_table({"blk.0.w": 4, "blk.2.w": 4}, 2, 0) == ((), 0)  # layer 2 of 2
    assert offload.layer_table({"blk.0.w": 4}, 2, 0) == ((), 0)  # layer 1 missing
    assert offload.layer_table({"blk.0.w": 4, "blk.1.w": 5, "output.weight": 7}, 2, 99) == ((4, 5), 7)


def test_the_gpus_part_grows_from_the_output_layer_then_layer_by_layer_from_the_last(real_models, tmp_path):
    shape = shape_of(SMOLLM2, tmp_path)
    est = Estimate(weights=100 * MIB, kv=30 * MIB, compute=7 * MIB, draft_model=3 * MIB)
    n, all_layers = shape.n_layer, offload.all_layers(shape)
    parts = [offload.device_bytes(shape, est, k) for k in range(all_layers + 1)]
    split = offload.split_compute_bytes(est, 0, all_layers)  # layers left in host memory
    assert split > 0 and offload.split_compute_bytes(est, all_layers, all_layers) == 0
    assert parts[0] == est.compute + split  # no layer: the compute buffer; the draft model stays in host memory too
    assert parts[1] - parts[0] == shape.output_bytes + est.draft_model  # the output layer goes first, the draft with it
    for k in range(1, n + 1):  # then layer n - k, with its share of the KV cache
        kv_step = est.kv * k // n - est.kv * (k - 1) // n
        whole = split if k == n else 0  # the last layer puts the whole model there: no split buffer
        assert parts[k + 1] - parts[k] == shape.block_bytes[n - k] + kv_step - whole
    assert offload.device_bytes(shape, est, -1) == offload.device_bytes(shape, est, 10_000) == parts[all_layers]
    assert parts[all_layers] == sum(shape.block_bytes) + shape.output_bytes + est.kv + est.compute + est.draft_model


def test_the_most_layers_that_fit(real_models, tmp_path):
    shape = shape_of(GEMMA3, tmp_path)
    est = Estimate(weights=250 * MIB, kv=40 * MIB, compute=20 * MIB)
    for k in (0, 1, 9):
        exact = offload.device_bytes(shape, est, k)
        assert offload.fit_layers(shape, est, exact) == k
        if k:
            assert offload.fit_layers(shape, est, exact - 1) == k - 1
    # the whole model needs no split compute buffer: a byte less can cost more than one layer
    total = offload.all_layers(shape)
    whole = offload.device_bytes(shape, est, total)
    assert offload.fit_layers(shape, est, whole) == total
    below = offload.fit_layers(shape, est, whole - 1)
    assert below is not None and below < total and offload.device_bytes(shape, est, below) < whole
    assert all(offload.device_bytes(shape, est, k) >= whole for k in range(below + 1, total))
    assert offload.fit_layers(shape, est, est.compute - 1) is None


def test_a_split_model_fits_the_budget_it_overran_on_an_h200(real_models, tmp_path):
    """bench/results/cuda: SmolLM2 (f16 KV, 4 x 4096) under a 247 MiB budget got 14 of 31 layers and
    held 250515291 bytes of GPU memory against a critical watermark of 246048358: the estimate
    without the split compute buffer said 14 layers fit."""
    cfg = msgspec.convert({"name": "smollm2-half", "path": SMOLLM2.name, "n_ctx": 4096, "n_parallel": 4,
                           "kv_cache": {"mode": "f16"}}, ModelConfig)
    shape = shape_of(SMOLLM2, tmp_path)
    est = estimate(shape, cfg)
    assert offload.device_bytes(shape, est, 14) >= 250515291  # what 14 layers measured
    assert offload.fit_layers(shape, est, 246048358) == 13


def test_without_a_layer_table_the_weights_are_shared_out_evenly():
    from appliance.resources.estimate import GgufShape

    shape = GgufShape("llama", n_layer=3, n_embd=8, n_ff=8, n_head=1, n_head_kv=1, key_length=8, value_length=8,
                      n_vocab=10, tensor_bytes=400)
    est = Estimate(weights=400, kv=30, compute=5)
    assert [offload.device_bytes(shape, est, k) for k in range(5)] == [8, 108, 218, 328, 435]  # + 3: split


def test_buffer_lines_split_between_gpu_and_host_memory():
    lines = [
        "load_tensors:        CUDA0 model buffer size =    64.00 MiB",
        "load_tensors:   CPU_Mapped model buffer size =    32.00 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =    16.00 MiB",
        "llama_kv_cache:        CPU KV buffer size =     2.00 MiB",
        "llama_context:  CUDA_Host  output buffer size =     1.00 MiB",
        "llama_context:      CUDA0 compute buffer size =     8.00 MiB",
        "llama_context:  CUDA_Host compute buffer size =     4.00 MiB",
    ]
    b = native.parse_buffer_sizes(lines)
    assert (b.weights, b.kv, b.compute, b.output) == (96 * MIB, 18 * MIB, 12 * MIB, 1 * MIB)
    assert (b.weights_device, b.kv_device, b.compute_device, b.output_device) == (64 * MIB, 16 * MIB, 8 * MIB, 0)
    assert b.device == 88 * MIB and b.total == 127 * MIB


def test_a_cpu_only_load_puts_nothing_in_gpu_memory(real_models):
    loaded = native.load(SMOLLM2, n_ctx_total=512, n_seq_max=1, n_batch=64, n_threads=2, type_k="f16",
                         type_v="f16", flash_attn="auto", n_gpu_layers=5)  # no GPU: llama.cpp ignores it
    try:
        assert loaded.buffers.total > 90 * MIB and loaded.buffers.device == 0
    finally:
        loaded.free()
