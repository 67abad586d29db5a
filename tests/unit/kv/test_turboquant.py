"""TurboQuant: codebooks derived by Lloyd-Max, the numpy reference codec, and the C codec
matching it bit for bit."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from appliance.kv import codebooks, turboquant
from appliance.kv.codebooks import BLOCK, lloyd_max

ROOT = Path(__file__).resolve().parents[3]
NATIVE = ROOT / "native" / "turboquant"
MODES = {"turbo4": 4, "turbo3": 3, "turbo2": 2}


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_codebook_is_a_lloyd_max_fixed_point(bits):
    cb = lloyd_max(bits)
    c, t = cb.centroids.astype(np.float64), cb.thresholds.astype(np.float64)
    assert len(c) == 2**bits and np.all(np.diff(c) > 0)
    np.testing.assert_allclose(c, -c[::-1], atol=1e-7)  # symmetric density, symmetric codebook
    np.testing.assert_allclose(t, (c[1:] + c[:-1]) / 2, atol=1e-6)  # nearest-neighbour condition
    # Centroid condition, checked by sampling the density independently of the derivation:
    # coordinates of random unit vectors in 64 dimensions, scaled by 8.
    rng = np.random.default_rng(bits)
    v = rng.standard_normal((200_000, BLOCK))
    y = (v / np.linalg.norm(v, axis=1, keepdims=True) * np.sqrt(BLOCK)).reshape(-1)[:2_000_000]
    idx = np.searchsorted(t, y)
    means = np.array([y[idx == k].mean() for k in range(len(c))])
    np.testing.assert_allclose(means, c, atol=0.01)
    mse = np.mean((y - c[idx]) ** 2)
    assert abs(mse - cb.mse) / cb.mse < 0.02


def test_more_bits_less_error_and_close_to_gaussian_lloyd_max():
    mses = [lloyd_max(b).mse for b in (1, 2, 3, 4)]
    assert mses == sorted(mses, reverse=True)
    # Gaussian Lloyd-Max MSEs are 0.3634, 0.1175, 0.03454, 0.009497; the sphere's coordinate
    # density has lighter tails, so it is a little lower and close.
    for got, gauss in zip(mses, (0.3634, 0.1175, 0.03454, 0.009497)):
        assert 0.9 * gauss < got < gauss


def test_generated_c_header_matches_the_derivation():
    assert (NATIVE / "turboquant_codebooks.h").read_text() == codebooks.c_header()


@pytest.mark.parametrize("mode,bits_per_value,ratio", [("turbo4", 4.375, 0.28), ("turbo3", 3.5, 0.22),
                                                        ("turbo2", 2.5, 0.16)])
def test_layout_sizes(mode, bits_per_value, ratio):
    bits = MODES[mode]
    assert turboquant.bits_per_value(bits) == bits_per_value
    assert turboquant.bits_per_value(bits) / 16 <= ratio
    x = np.zeros(256, dtype=np.float32)
    assert len(turboquant.quantize(x, mode)) == turboquant.row_bytes(bits, 256) == 4 * turboquant.block_bytes(bits)


# Relative squared error of the codec on Gaussian data: below the plain Lloyd-Max codebook at the
# block norm (the gain search can only help) and below q4_0's on the same data for turbo4.
ROUNDTRIP_BOUND = {"turbo4": 0.0065, "turbo3": 0.0225, "turbo2": 0.098}


@pytest.mark.parametrize("mode", MODES)
def test_reference_roundtrip_error_bounds(mode):
    rng = np.random.default_rng(1)
    x = turboquant.rotate(rng.standard_normal((512, 128)).astype(np.float32) * 3, 128, seed=5)
    y = turboquant.dequantize(turboquant.quantize(x, mode), mode).reshape(x.shape)
    rel = np.mean((x - y) ** 2) / np.mean(x**2)
    assert rel < ROUNDTRIP_BOUND[mode] < lloyd_max(MODES[mode]).mse
    assert rel > 0.7 * ROUNDTRIP_BOUND[mode]  # and not suspiciously good (a broken test set-up)


def test_gain_codes_follow_the_sub_block_scale():
    # A block whose second half is 4x quieter than its first: the sub-blocks must pick
    # different gains, and the quiet half must keep its precision.
    rng = np.random.default_rng(7)
    x = rng.standard_normal(64).astype(np.float32)
    x[32:] *= 0.25
    q = turboquant.quantize(x, "turbo4")
    assert q[2] & 15 > q[2] >> 4
    y = turboquant.dequantize(q, "turbo4")
    assert np.mean((x[32:] - y[32:]) ** 2) / np.mean(x[32:] ** 2) < 0.02


def test_rotation_is_orthogonal():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((10, 64)).astype(np.float32)
    r = turboquant.rotate(x, 64, seed=3)
    np.testing.assert_allclose(np.linalg.norm(r, axis=1), np.linalg.norm(x, axis=1), rtol=1e-5)


def test_zero_and_huge_blocks():
    x = np.zeros(64, dtype=np.float32)
    assert np.all(turboquant.dequantize(turboquant.quantize(x, "turbo3"), "turbo3") == 0)
    big = np.full(64, 1e6, dtype=np.float32)
    norm = np.frombuffer(turboquant.quantize(big, "turbo4")[:2], "<f2")[0]
    assert norm == np.float16(65504)


@pytest.fixture(scope="module")
def libtq(tmp_path_factory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("tq") / "libtq.so"
    subprocess.run(["cc", "-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC", "-Wall", "-Wextra",
                    "-Werror", "-o", str(out), str(NATIVE / "turboquant.c"), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.tq_quantize_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.tq_dequantize_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.tq_row_bytes.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.tq_row_bytes.restype = ctypes.c_size_t
    lib.tq_vec_dot_f32.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.tq_vec_dot_f32.restype = ctypes.c_float
    lib.tq_fp32_to_fp16.argtypes = [ctypes.c_float]
    lib.tq_fp32_to_fp16.restype = ctypes.c_uint16
    return lib


def _c_quantize(lib, bits: int, x: np.ndarray) -> bytes:
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = ctypes.create_string_buffer(lib.tq_row_bytes(bits, x.size))
    assert lib.tq_quantize_row(bits, x.ctypes.data, out, x.size) == 0
    return out.raw


def _c_dequantize(lib, bits: int, data: bytes, n: int) -> np.ndarray:
    y = np.empty(n, dtype=np.float32)
    assert lib.tq_dequantize_row(bits, data, y.ctypes.data, n) == 0
    return y


def test_c_fp16_conversion_matches_numpy(libtq):
    rng = np.random.default_rng(4)
    values = np.concatenate([
        rng.standard_normal(20000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 5, 20000),
        np.array([0.0, -0.0, 65504.0, 65519.0, 65520.0, 6.1e-5, 5.96e-8, 2.98e-8, 1e-10], dtype=np.float32),
    ]).astype(np.float32)
    ours = np.array([libtq.tq_fp32_to_fp16(float(v)) for v in values], dtype=np.uint16)
    with np.errstate(over="ignore"):  # values past 65504 become inf on both sides
        expected = values.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(ours, expected)


def _test_rows(bits: int) -> list[np.ndarray]:
    rng = np.random.default_rng(bits)
    return [
        rng.standard_normal(64 * 64).astype(np.float32),
        (rng.standard_normal(64 * 32) * 40).astype(np.float32),
        turboquant.rotate(rng.standard_t(3, (64, 128)).astype(np.float32), 128, seed=9).reshape(-1),
        np.zeros(128, dtype=np.float32),
        (rng.standard_normal(256) * 1e-6).astype(np.float32),
        np.concatenate([np.zeros(32), rng.standard_normal(32)]).astype(np.float32),
    ]


@pytest.mark.parametrize("simd", [True, False], ids=["simd", "scalar"])
@pytest.mark.parametrize("mode", MODES)
def test_c_codec_matches_the_reference_bit_for_bit(libtq, mode, simd):
    bits = MODES[mode]
    previous = libtq.tq_set_simd(int(simd))
    try:
        for x in _test_rows(bits):
            ref = turboquant.quantize(x, mode)
            assert _c_quantize(libtq, bits, x) == ref
            np.testing.assert_array_equal(_c_dequantize(libtq, bits, ref, x.size), turboquant.dequantize(ref, mode))
    finally:
        libtq.tq_set_simd(previous)


@pytest.mark.parametrize("simd", [True, False], ids=["simd", "scalar"])
@pytest.mark.parametrize("mode", MODES)
def test_c_vec_dot_is_the_dot_product_of_the_decoded_row(libtq, mode, simd):
    bits = MODES[mode]
    rng = np.random.default_rng(11)
    x = rng.standard_normal(256).astype(np.float32)
    q = rng.standard_normal(256).astype(np.float32)
    data = turboquant.quantize(x, mode)
    expected = float(np.dot(turboquant.dequantize(data, mode).astype(np.float64), q))
    previous = libtq.tq_set_simd(int(simd))
    try:
        got = libtq.tq_vec_dot_f32(bits, data, q.ctypes.data, 256)
    finally:
        libtq.tq_set_simd(previous)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-4)


def test_c_rejects_bad_arguments(libtq):
    x = np.zeros(64, dtype=np.float32)
    buf = ctypes.create_string_buffer(64)
    assert libtq.tq_quantize_row(5, x.ctypes.data, buf, 64) == -1
    assert libtq.tq_quantize_row(4, x.ctypes.data, buf, 63) == -1
    assert libtq.tq_row_bytes(4, 100) == 0
