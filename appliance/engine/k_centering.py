"""K centring: each KV head's keys are stored minus a fixed vector, their mean.

Attention does not change when every key of a head is shifted by the same vector c: each score
q·k of a query moves by the same q·c and softmax ignores a common shift. The stored rows do
change: in SmolLM2 and Gemma 3 about half the energy of a key (after RoPE) is the head's mean
over positions, and a quantizer whose error grows with the row's norm loses half as much on the
centred rows (TurboQuant turbo3: 0.0201 → 0.0096 relative squared error on SmolLM2's keys).

The mean comes from a short calibration text run through an f16 context once per model file and
llama.cpp build (cached under the cache directory); llama.cpp subtracts it in the graph before
storing K (`llama_set_k_centers`, added by the patch). Every context of a model gets the same
vector, in the space of its own KV type (quantized types store K Hadamard-rotated), so sequence
states stay interchangeable between contexts and types: migration, the prefix cache and its disk
tier work on centred rows unchanged. Any vector keeps attention exact, so a stale or different
cached mean only costs compression quality, never correctness; the prefix cache's identity
includes the vector's digest so entries are never mixed.

Not applied where the shift would not cancel: attention logit soft-capping (tanh of the score),
attention sinks (a per-head logit compared with the scores), or a GPU offload (TurboQuant is
CPU-only, and the subtraction would break llama.cpp's fused rope-and-store there).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from importlib import resources
from pathlib import Path

import llama_cpp as lc
import numpy as np

from ..kv import ggml_rows
from ..kv import state as kv_state
from ..kv.migrate import read_sequence
from ..resources import file_facts
from ..resources.architectures import is_encoder
from ..resources.cores import CoreBudget
from .decode import decode_with_cores
from .load_cancel import raise_if_set
from .prefix import build_id


CALIBRATION_TOKENS = 512
_CHUNK = 128


class CenteringError(RuntimeError):
    pass


def unsupported_reason(metadata: dict[str, str], gpu_backend: str | None) -> str | None:
    """Why K centring cannot be used for this model, or None."""
    arch = metadata.get("general.architecture", "")
    if is_encoder(arch):
        return "an encoder has no KV cache"
    softcap = metadata.get(f"{arch}.attn_logit_softcapping")
    if softcap not in (None, "", "0", "0.0"):
        return "attention logit soft-capping does not ignore a common shift of the scores"
    if arch in ("gpt-oss", "openai-moe"):
        return "attention sinks compare a fixed logit with the scores"
    if gpu_backend is not None:
        return f"the KV cache lives on {gpu_backend}"
    return None


def _set_centers_fn():
    fn = getattr(_set_centers_fn, "fn", None)
    if fn is None:
        try:
            fn = lc.llama_cpp._lib.llama_set_k_centers
        except AttributeError:
            raise CenteringError("this llama.cpp build has no llama_set_k_centers; rebuild it with `make setup`")
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t]
        fn.restype = ctypes.c_bool
        _set_centers_fn.fn = fn
    return fn


def available() -> bool:
    try:
        _set_centers_fn()
    except CenteringError:
        return False
    return True


def calibration_text() -> str:
    return resources.files("appliance.kv").joinpath("calibration.txt").read_text(encoding="utf-8")


def measure(model: lc.llama_model_p, n_threads: int, cores: CoreBudget | None = None,
            cancel: threading.Event | None = None) -> np.ndarray:
    """Per-layer mean K (float32, all KV layers in state order, unrotated) over the calibration text;
    raises LoadCancelled before a chunk once `cancel` is set."""
    vocab = lc.llama_model_get_vocab(model)
    data = calibration_text().encode()
    arr = (lc.llama_token * (len(data) + 8))()
    n = lc.llama_tokenize(vocab, data, len(data), arr, len(arr), True, False)
    tokens = list(arr[: min(n, CALIBRATION_TOKENS)])
    if len(tokens) < 64:
        raise CenteringError("the calibration text gave too few tokens")
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = CALIBRATION_TOKENS + 256
    cparams.n_batch = cparams.n_ubatch = _CHUNK
    cparams.n_seq_max = 1
    cparams.n_outputs_max = 1  # the last row of each chunk: no compute buffer for a chunk of logits
    cparams.n_threads = cparams.n_threads_batch = n_threads
    cparams.type_k = cparams.type_v = ggml_rows.GGML_TYPES["f16"]
    cparams.no_perf = True
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        raise CenteringError("llama.cpp could not create the calibration context")
    batch = lc.llama_batch_init(_CHUNK, 0, 1)
    threads_set = n_threads
    try:
        for start in range(0, len(tokens), _CHUNK):
            raise_if_set(cancel)
            chunk = tokens[start : start + _CHUNK]
            for i, t in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, start + i, 1, 0
                batch.seq_id[i][0] = 0
            batch.logits[len(chunk) - 1] = 1
            batch.n_tokens = len(chunk)
            rc, threads_set = decode_with_cores(ctx, batch, cores, n_threads, threads_set)
            if rc != 0:
                raise CenteringError("llama_decode failed on the calibration text")
        parsed = kv_state.parse(read_sequence(ctx, 0))
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    means = []
    for cache in parsed.caches:
        stream = next((s for s in cache.streams if s.cell_count), None)
        if stream is None:
            raise CenteringError("the calibration context holds no cells")
        for layer in stream.k:
            means.append(kv_state.layer_values(layer, stream.cell_count).astype(np.float64).mean(axis=0))
    return np.concatenate(means).astype(np.float32)


def centers_for(model: lc.llama_model_p, path: Path, n_threads: int, cache_dir: Path | None,
                cores: CoreBudget | None = None, cancel: threading.Event | None = None) -> np.ndarray:
    """The model's K means: from the cache directory when measured before, else measured (and saved)."""
    text = calibration_text()
    key = (*file_facts.stat_key(path), build_id(), CALIBRATION_TOKENS, hashlib.sha256(text.encode()).hexdigest())
    stored = file_facts.load(cache_dir, file_facts.K_CENTERS, key)
    if isinstance(stored, list) and stored and all(isinstance(v, float) for v in stored):
        return np.asarray(stored, dtype=np.float32)
    centers = measure(model, n_threads, cores, cancel)
    file_facts.save(cache_dir, file_facts.K_CENTERS, key, [float(v) for v in centers])
    return centers


def in_type_space(centers: np.ndarray, type_k: str, rot_k: int) -> np.ndarray:
    """The centres as a context of `type_k` stores K: quantized types hold K Hadamard-rotated."""
    if rot_k and ggml_rows.rotated(ggml_rows.GGML_TYPES[type_k]):
        return ggml_rows.hadamard(centers.reshape(1, -1), rot_k).reshape(-1)
    return centers


def apply(ctx: lc.llama_context_p, centers: np.ndarray, type_k: str, rot_k: int) -> None:
    vec = np.ascontiguousarray(in_type_space(centers, type_k, rot_k), dtype=np.float32)
    ok = _set_centers_fn()(ctx, vec.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), vec.size)
    if not ok:
        raise CenteringError(f"llama.cpp refused {vec.size} K centre values for this context")


def digest(centers: np.ndarray | None) -> str:
    return "none" if centers is None else hashlib.sha256(np.ascontiguousarray(centers).tobytes()).hexdigest()[:16]
