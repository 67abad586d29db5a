"""How much of a model a GPU holds (`models[].n_gpu_layers`).

llama.cpp counts the output layer as layer L after the L repeating ones and offloads the last n
of those L + 1 (llama-model.cpp, `i_gpu_start = n_layer + 1 - n_gpu_layers`): n = 1 is the output
layer alone, n = 2 adds repeating layer L - 1, and so on. The token embeddings stay in host memory
(their lookup runs on the CPU). An offloaded layer keeps its KV cache on the GPU, and the compute
buffer is on the GPU whatever n is (larger when layers stay in host memory). `auto` takes
all L + 1 layers when they fit the budget and otherwise the most that fit: the model then runs
partly on the CPU, slower, instead of not at all.

On a GPU the memory budget is that GPU's memory, so a model is charged what it puts there
(`device_bytes`); on a CPU-only host it is charged everything.
"""

from __future__ import annotations

from collections.abc import Mapping

from .estimate import Estimate, GgufShape


def layer_table(sizes: Mapping[str, int], n_layer: int, tied_output_bytes: int) -> tuple[tuple[int, ...], int]:
    """From a GGUF's tensor sizes: the bytes of each repeating layer (`blk.<i>.*`), and the bytes
    the output layer puts on the GPU (its matrix, or a copy of the tied token embeddings, and its
    norm). ((), 0) when the table does not describe `n_layer` layers."""
    blocks = [0] * n_layer
    for name, size in sizes.items():
        if name.startswith("blk."):
            index = name.split(".", 2)[1]
            if not index.isdigit() or int(index) >= n_layer:
                return (), 0
            blocks[int(index)] += size
    if n_layer == 0 or not all(blocks):
        return (), 0
    output = sizes.get("output.weight", tied_output_bytes) + sizes.get("output_norm.weight", 0)
    return tuple(blocks), output


def all_layers(shape: GgufShape) -> int:
    """n_gpu_layers that offloads everything llama.cpp can: the repeating layers and the output."""
    return shape.n_layer + 1


def device_bytes(shape: GgufShape, est: Estimate, layers: int) -> int:
    """What the GPU holds with `layers` offloaded (negative: all): their weights and KV cache, the
    compute buffer (larger when layers stay in host memory: `split_compute_bytes`), and a draft
    model (offloaded whole, unless the target keeps every layer in host memory: then the draft
    model does too)."""
    total = all_layers(shape)
    n = total if layers < 0 else min(layers, total)
    n_layer = shape.n_layer
    repeating = max(n - 1, 0)  # the output layer goes first
    if len(shape.block_bytes) == n_layer and n_layer:
        weights = sum(shape.block_bytes[n_layer - repeating:]) + (shape.output_bytes if n else 0)
    else:  # no tensor table: a proportional share of the weights
        weights = est.weights * n // total
    kv = est.kv * repeating // n_layer if n_layer else est.kv
    return weights + kv + est.compute + split_compute_bytes(est, n, total) + (est.draft_model if n else 0)


def split_compute_bytes(est: Estimate, n: int, total: int) -> int:
    """What the GPU's compute buffer holds beyond the whole model's when layers stay in host memory:
    llama.cpp runs a large batch's matrix products of those layers on the GPU too (op offload),
    and copies their inputs into that buffer. Measured on an H200 (SmolLM2, 14 of 31 layers, n_ctx
    4 x 4096): 28.0 MB of GPU compute buffer against 17.2 MB with every layer there, and 239 MiB in
    all where this estimate without it said 232; 0.6 of the compute estimate covers that."""
    return est.compute * 3 // 5 if n < total else 0


def fit_layers(shape: GgufShape, est: Estimate, room: int) -> int | None:
    """The most layers whose `device_bytes` fit in `room` (0: weights and KV stay in host memory),
    None when not even the compute buffer does."""
    for n in range(all_layers(shape), -1, -1):
        if device_bytes(shape, est, n) <= room:
            return n
    return None
