"""Files llama.cpp aborts the process on past the vocabulary (found by mutating a tiny model's
file): at the model load, at the context's graphs, at the first decode. The child read
(engine/gguf_header.py: a trial load and context, then engine/gguf_checks.py) fails each with
the reason named, where an in-process load would end the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import gguf
import pytest

from appliance.engine import gguf_checks, gguf_header
from tiny_llama import write_tiny_llama

Q = gguf.GGMLQuantizationType
CASES = {
    "layers-0": ({"block_count": 0}, "GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS)"),
    "layers-100000": ({"block_count": 100000}, "hparams.n_layer_all <= LLAMA_MAX_LAYERS"),
    "kv-heads-3-of-4": ({"n_head_kv": 3}, "GGML_ASSERT(ggml_can_mul_mat(k, q)) failed"),
    "negative-eps": ({"eps": -1.0}, "llama.attention.layer_norm_rms_epsilon is -1.000000"),
    "quantized-norm": ({"tensor_types": {"output_norm.weight": Q.Q8_0}},
                       "tensor 'output_norm.weight' is Q8_0: a norm's weights must be F32, F16 or BF16"),
    "i32-matrix": ({"tensor_types": {"blk.1.ffn_up.weight": Q.I32}}, "tensor 'blk.1.ffn_up.weight' is I32"),
    "f64-matrix": ({"tensor_types": {"blk.0.attn_v.weight": Q.F64}}, "tensor 'blk.0.attn_v.weight' is F64"),
}


@pytest.mark.parametrize("case", CASES)
def test_the_child_read_fails_a_file_llama_cpp_would_abort_on(tmp_path, case):
    knobs, reason = CASES[case]
    path = write_tiny_llama(tmp_path / f"{case}.gguf", **knobs)
    with pytest.raises(ValueError) as e:
        gguf_header.read(path)
    assert f"{case}.gguf" in str(e.value) and reason in str(e.value), str(e.value)


def test_a_well_formed_tiny_model_passes(tmp_path):
    meta = gguf_header.read(write_tiny_llama(tmp_path / "fine.gguf"))
    assert meta["general.architecture"] == "llama" and meta["n_vocab"] == "300"


@pytest.mark.parametrize("case", ["layers-0", "kv-heads-3-of-4", "negative-eps"])
def test_in_process_such_a_file_ends_the_process(tmp_path, case):
    """Why the read is a child's: llama.cpp aborts, at the load, the context or the first decode."""
    path = write_tiny_llama(tmp_path / f"{case}.gguf", **CASES[case][0])
    script = (
        "import sys, llama_cpp as lc\n"
        "from pathlib import Path\n"
        "from appliance.engine import native\n"
        "m = native.load(Path(sys.argv[1]), n_ctx_total=256, n_seq_max=1, n_batch=32, n_threads=1,"
        " type_k='f16', type_v='f16', flash_attn='auto')\n"
        "b = lc.llama_batch_get_one((lc.llama_token * 2)(5, 6), 2)\n"
        "lc.llama_decode(m.ctx, b)\n"
        "print('survived')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    assert proc.returncode == -signal.SIGABRT and "survived" not in proc.stdout, (proc.returncode, proc.stderr[-500:])


def test_decode_problems_are_read_from_metadata_and_tensor_types():
    meta = {"general.architecture": "bert", "bert.attention.layer_norm_epsilon": "nan"}
    assert "bert.attention.layer_norm_epsilon is nan" in gguf_checks.decode_problem(meta, {})
    meta = {"general.architecture": "llama", "llama.attention.layer_norm_rms_epsilon": "0.0"}
    fine = {"blk.0.attn_norm.weight": ("F32", 256), "blk.0.attn_q.weight": ("Q4_K", 100),
            "token_embd_norm.weight": ("BF16", 128), "blk.0.attn_q.bias": ("F32", 10)}
    assert gguf_checks.decode_problem(meta, fine) is None
    assert "F16, or BF16" not in gguf_checks.decode_problem(meta, {"blk.3.ffn_norm.weight": ("Q4_0", 18)})
    assert "I8" in gguf_checks.decode_problem(meta, {"output.weight": ("I8", 300)})
