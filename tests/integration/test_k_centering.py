"""K centring (engine/k_centering.py) on real models: attention stays exact (an f16 context
gives the same next-token distributions with and without it), a quantized K cache loses less
(turbo3 KL divergence against f16 falls), centred states migrate between types like any other,
the measured means are cached per model file, and models it cannot serve are left alone."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

import llama_cpp as lc

from appliance.engine import k_centering, native
from appliance.kv import migrate
from conftest import GEMMA3, SMOLLM2, model_entry

TEXT = Path("/usr/share/common-licenses/GPL-3").read_text()
CHUNK = 128


class Reader:
    """One sequence fed chunk by chunk; logits for every position."""

    def __init__(self, path: Path, kv: str, center: bool, cache_dir: Path | None = None, n_ctx: int = 1024):
        k, _, v = kv.partition("/")
        self.m = native.load(path, n_ctx_total=n_ctx, n_seq_max=1, n_batch=CHUNK, n_threads=2,
                             type_k=k, type_v=v or k, flash_attn="on", center_k=center, cache_dir=cache_dir)
        self.batch = lc.llama_batch_init(CHUNK, 0, 1)
        self.pos = 0

    def tokens(self, n: int) -> list[int]:
        return native.Vocab(self.m.vocab, self.m.n_vocab).tokenize(TEXT, add_special=True, parse_special=False)[:n]

    def feed(self, tokens: list[int], logits_from: int = 0) -> np.ndarray:
        """Logits for tokens[logits_from:] (Gemma's rows are 262,144 wide: the others are not computed)."""
        out = []
        for start in range(0, len(tokens), CHUNK):
            chunk = tokens[start : start + CHUNK]
            b = self.batch
            for i, t in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, self.pos + i, 1, start + i >= logits_from
                b.seq_id[i][0] = 0
            b.n_tokens = len(chunk)
            assert lc.llama_decode(self.m.ctx, b) == 0
            self.pos += len(chunk)
            rows = sum(1 for i in range(len(chunk)) if start + i >= logits_from)
            if rows:
                out.append(np.ctypeslib.as_array(lc.llama_get_logits(self.m.ctx), shape=(rows, self.m.n_vocab)).copy())
        return np.concatenate(out) if out else np.empty((0, self.m.n_vocab), np.float32)

    def close(self) -> None:
        lc.llama_batch_free(self.batch)
        self.m.free()


def mean_kld(ref: np.ndarray, got: np.ndarray, rows: int = 16) -> float:
    """KL(ref || got) per position, averaged; in float64, a few rows at a time (Gemma's 512 x 262,144
    logits whole took 17 s, in blocks that stay in cache 3.5 s)."""
    total = 0.0
    for i in range(0, len(ref), rows):
        a, b = ref[i : i + rows].astype(np.float64), got[i : i + rows].astype(np.float64)
        a -= a.max(axis=1, keepdims=True)
        b -= b.max(axis=1, keepdims=True)
        p = np.exp(a)
        z = p.sum(axis=1, keepdims=True)
        p /= z
        a -= np.log(z)
        b -= np.log(np.exp(b).sum(axis=1, keepdims=True))
        total += float((p * (a - b)).sum())
    return total / len(ref)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kcenters")


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_centring_keeps_attention_exact_and_cuts_the_turbo3_loss(path, cache):
    plain = Reader(path, "f16", center=False)
    tokens = plain.tokens(512)
    ref = plain.feed(tokens)
    plain.close()

    centred_f16 = Reader(path, "f16", center=True, cache_dir=cache)
    centers = centred_f16.m.k_centers
    assert centers is not None
    # the means are large: half or so of a key's energy on these models
    assert float(np.abs(centers).max()) > 0.5
    exact = mean_kld(ref, centred_f16.feed(tokens))
    centred_f16.close()
    # Attention ignores the shift; what changes is how the stored rows round to f16. The same
    # change comes from a shift 10,000 times smaller, which does nothing but round differently
    # (these models' keys reach magnitudes where f16 steps are coarse).
    nudged = Reader(path, "f16", center=False)
    k_centering.apply(nudged.m.ctx, centers * 1e-4, "f16", 0)
    rounding = mean_kld(ref, nudged.feed(tokens))
    nudged.close()
    assert exact < 2 * rounding + 1e-4 and exact < 0.02, (exact, rounding)

    losses = {}
    for center in (False, True):
        r = Reader(path, "turbo3", center=center, cache_dir=cache)
        losses[center] = mean_kld(ref, r.feed(tokens))
        r.close()
    assert losses[True] < 0.8 * losses[False], losses


def test_the_means_are_measured_once_per_model_file_and_a_damaged_cache_is_measured_again(cache):
    first = Reader(SMOLLM2, "f16", center=True, cache_dir=cache)
    files = list((cache / "k-centers").glob("*.json"))
    assert files, "the measured means were not saved"
    saved = first.m.k_centers.copy()
    first.close()
    again = Reader(SMOLLM2, "q8_0", center=True, cache_dir=cache)
    assert np.array_equal(again.m.k_centers, saved)
    again.close()
    for f in files:
        f.write_bytes(b"not numpy")
    redo = Reader(SMOLLM2, "f16", center=True, cache_dir=cache)
    assert redo.m.k_centers is not None and np.allclose(redo.m.k_centers, saved, atol=1e-3)
    redo.close()


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_a_centred_sequence_migrates_f16_to_turbo3_like_a_fresh_turbo3_context(path, cache):
    ref_reader = Reader(path, "f16", center=False)
    tokens = ref_reader.tokens(600)
    ref = ref_reader.feed(tokens, logits_from=500)
    ref_reader.close()

    source = Reader(path, "f16", center=True, cache_dir=cache)
    source.feed(tokens[:500], logits_from=500)
    ctx, _sizes = native.new_context(source.m, "turbo3", "turbo3")
    migrate.migrate(source.m.ctx, ctx, [0], type_k="turbo3", type_v="turbo3",
                    rot=migrate.rotation_sizes(source.m.metadata))
    source.m.swap_context(ctx, source.m.buffers, "turbo3", "turbo3")
    migrated = mean_kld(ref, source.feed(tokens[500:]))
    source.close()

    fresh = Reader(path, "turbo3", center=True, cache_dir=cache)
    target = mean_kld(ref, fresh.feed(tokens, logits_from=500))
    fresh.close()
    assert migrated <= 1.5 * target + 1e-3, (migrated, target)


def test_models_whose_attention_is_not_shift_invariant_are_not_centred():
    assert k_centering.unsupported_reason({"general.architecture": "gemma2", "gemma2.attn_logit_softcapping": "50.0"},
                                          None)
    assert k_centering.unsupported_reason({"general.architecture": "gpt-oss"}, None)
    assert k_centering.unsupported_reason({"general.architecture": "llama"}, "CUDA")
    assert k_centering.unsupported_reason({"general.architecture": "llama"}, None) is None
    assert k_centering.unsupported_reason({"general.architecture": "bert"}, None) == "an encoder has no KV cache"


def test_the_server_reports_centring_per_model(server_factory):
    srv = server_factory({"models": [model_entry("on", SMOLLM2, n_ctx=1024, kv_cache={"mode": "turbo3"}),
                                     model_entry("off", SMOLLM2, n_ctx=1024,
                                                 kv_cache={"mode": "turbo3", "center_k": False})]}, "kcenter")
    models = {m["name"]: m for m in httpx.get(srv.base + "/v1/admin/vram/status").json()["models"]}
    assert models["on"]["k_centered"] is True
    assert models["off"]["k_centered"] is False
    r = httpx.post(srv.base + "/v1/chat/completions", timeout=60, json={
        "model": "on", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8})
    assert r.status_code == 200
