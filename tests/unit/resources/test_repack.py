"""resources/repack.py: which GGUFs tie their output to the token embeddings, and the repacked copy
of that matrix the estimates count on a build that keeps one (ggml's AMX buffer)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

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
    assert repack.tied_output(tied) == ("F32", embd.nbytes)
    assert repack.tied_output(untied) == ("", 0)
    assert repack.tied_output(tmp_path / "missing.gguf") == ("", 0)


def shape(tied_type: str, tied_bytes: int = 34 * 64, n_embd: int = 64, n_vocab: int = 32) -> GgufShape:
    return GgufShape(architecture="test", n_layer=1, n_embd=n_embd, n_ff=0, n_head=1, n_head_kv=1, key_length=64,
                     value_length=64, n_vocab=n_vocab, tensor_bytes=10_000, tied_output_type=tied_type,
                     tied_output_bytes=tied_bytes)


@pytest.mark.parametrize("amx,s,copy", [
    (True, shape("Q8_0"), 38 * 64),  # Q8_0 blocks of 34 bytes are packed in 38
    (True, shape("Q4_1", 20 * 64), 20 * 64),
    (True, shape("F16", 4096), 0),  # no AMX kernel for it
    (True, shape("Q8_0", n_vocab=48), 0),  # outputs not a multiple of 32: the matmul stays on the plain CPU buffer
    (True, shape("Q4_K", 144 * 2, n_embd=256), 144 * 2),
    (True, shape("Q4_K", 144 * 2, n_embd=64 * 5), 0),  # K-quant rows must be a multiple of 256 long
    (True, shape(""), 0),  # not tied
    (False, shape("Q8_0"), 0),  # no AMX in this build, or the output layer is on a GPU
])
def test_repacked_copy_counts_where_amx_takes_the_output(monkeypatch, amx: bool, s: GgufShape, copy: int):
    monkeypatch.setattr(repack, "cpu_repacks_with_amx", lambda: amx)
    assert repack.repacked_output_bytes(s) == copy
