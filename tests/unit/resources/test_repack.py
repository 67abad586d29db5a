"""resources/repack.py: which GGUFs tie their output to the token embeddings, and the repacked copy
of that matrix the estimates count on a build that keeps one (ggml's AMX buffer)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from appliance.engine import gguf_tensors
from appliance.resources import repack
from appliance.resources.estimate import GgufShape


def write_gguf(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tied_output_is_the_embeddings_when_there_is_no_output_matrix(tmp_path: Path):
    embd = np.zeros((64, 32), np.float32)
    tied = write_gguf(tmp_path / "tied.gguf", {"token_embd.weight": embd})
    untied = write_gguf(tmp_path / "untied.gguf", {"token_embd.weight": embd, "output.weight": embd})
    assert repack.tied_output(gguf_tensors.table(tied)) == ("F32", embd.nbytes)
    assert repack.tied_output(gguf_tensors.table(untied)) == ("", 0)
    assert gguf_tensors.table(tmp_path / "missing.gguf") == {}
    assert repack.tied_output({}) == ("", 0)


def shape(tied_type: str, tied_bytes: int = 34 * 64, n_embd: int = 64, n_vocab: int = 32) -> GgufShape:
    return GgufShape(architecture="test", n_layer=1, n_embd=n_embd, n_ff=0, n_head=1, n_head_kv=1, key_length=64,
                     value_length=64, n_vocab=n_vocab, tensor_bytes=10_000, tied_output_type=tied_type,
                     tied_output_bytes=tied_bytes)


AMX = {"AVX2": "1", "AVX512": "1", "AMX_INT8": "1", "REPACK": "1"}
AVX2 = {"AVX2": "1", "REPACK": "1"}
PI5 = {"NEON": "1", "DOTPROD": "1", "REPACK": "1"}  # Cortex-A76: dotprod, no i8mm


@pytest.mark.parametrize("features,s,copy", [
    (AMX, shape("Q8_0"), 38 * 64),  # Q8_0 blocks of 34 bytes are packed in 38
    (AMX, shape("Q4_1", 20 * 64), 20 * 64),
    (AMX, shape("F16", 4096), 0),  # no AMX kernel for it, nor a CPU_REPACK layout
    (AMX, shape("Q8_0", n_vocab=48), 0),  # outputs not a multiple of 32: the matmul stays on the plain CPU buffer
    (AMX, shape("Q4_K", 144 * 2, n_embd=256), 144 * 2),
    (AMX, shape("Q4_0", 18 * 64, n_vocab=40), 18 * 64),  # AMX declines (outputs not in 32s), CPU_REPACK takes it (8s)
    (AMX, shape(""), 0),  # not tied
    (AVX2, shape("Q8_0"), 0),  # x86 has no CPU_REPACK layout for Q8_0 (SmolLM2, Gemma 3 on the EPYC)
    (AVX2, shape("Q4_0", 18 * 64), 18 * 64),  # Q4_0 8x8 interleaved: the same bytes again
    (AVX2, shape("Q4_0", 18 * 64, n_vocab=36), 0),  # 8x8 needs outputs in eights
    (AVX2, shape("IQ4_NL", 18 * 64), 18 * 64),
    ({"AVX2": "1"}, shape("Q4_0", 18 * 64), 0),  # a build without CPU_REPACK
    (PI5, shape("Q8_0"), 34 * 64),  # Gemma 3's Q8_0 embeddings on a Raspberry Pi 5
    (PI5, shape("Q8_0", n_vocab=34), 0),  # 4x4 needs outputs in fours
    (PI5, shape("Q4_1", 20 * 64), 0),  # no ARM layout for Q4_1 (SmolLM2's layers)
    ({"NEON": "1", "REPACK": "1"}, shape("Q8_0"), 0),  # a Pi 4 (no dotprod): none
    ({"SVE": "1", "MATMUL_INT8": "1", "SVE_CNT": "32", "REPACK": "1"}, shape("Q4_0", 18 * 64), 18 * 64),
    ({"SVE": "1", "MATMUL_INT8": "1", "SVE_CNT": "16", "REPACK": "1"}, shape("Q4_0", 18 * 64), 0),
])
def test_repacked_copy_counts_where_an_extra_buffer_takes_the_output(monkeypatch, features, s: GgufShape, copy: int):
    monkeypatch.setattr(repack, "host_has_amx", lambda: True)
    assert repack.repacked_output_bytes(s, features) == copy


def test_amx_needs_the_host_as_well_as_the_build(monkeypatch):
    """A build with AMX kernels on a host without AMX (a release variant would not be chosen, but
    the setup build's flags could be copied) leaves the output on the plain buffer: Q8_0 on x86
    has no CPU_REPACK layout either."""
    monkeypatch.setattr(repack, "host_has_amx", lambda: False)
    assert repack.repacked_output_bytes(shape("Q8_0"), AMX) == 0


def test_no_copy_where_a_gpu_takes_the_output(monkeypatch):
    monkeypatch.setattr(repack, "cpu_output_features", lambda: None)
    assert repack.repacked_output_bytes(shape("Q4_0", 18 * 64)) == 0
