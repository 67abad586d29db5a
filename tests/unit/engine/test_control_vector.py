"""Reading control vector files (engine/control_vector.py): scaled files summed layer by layer
into llama.cpp's buffer (layer 1 first), the layer range, what a KV state's key depends on, and
a clear error for each file that cannot steer the model."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.engine.control_vector import ControlVectorError, read
from control_vectors import write_control_vector

N_EMBD, N_LAYER = 8, 5  # layers 1..4 can be steered


def vec(value: float) -> np.ndarray:
    return np.full(N_EMBD, value, dtype=np.float32)


def test_files_are_scaled_and_summed_per_layer(tmp_path):
    a = write_control_vector(tmp_path / "a.gguf", {1: vec(1), 3: np.arange(N_EMBD)})
    b = write_control_vector(tmp_path / "b.gguf", {3: vec(2), 4: vec(-1)})
    cv = read([(a, 0.5), (b, 2.0)], N_EMBD, N_LAYER)
    rows = cv.data.reshape(N_LAYER - 1, N_EMBD)
    assert np.array_equal(rows[0], vec(0.5))
    assert np.array_equal(rows[1], vec(0))
    assert np.array_equal(rows[2], np.arange(N_EMBD) * 0.5 + 4)
    assert np.array_equal(rows[3], vec(-2))
    assert (cv.layer_start, cv.layer_end) == (1, N_LAYER - 1)
    assert cv.nbytes == (N_LAYER - 1) * N_EMBD * 4


def test_the_layer_range_and_the_directions_make_its_identity(tmp_path):
    a = write_control_vector(tmp_path / "a.gguf", {2: vec(1)})
    whole = read([(a, 1.0)], N_EMBD, N_LAYER)
    assert read([(a, 1.0)], N_EMBD, N_LAYER).identity == whole.identity
    narrow = read([(a, 1.0)], N_EMBD, N_LAYER, [2, 3])
    assert (narrow.layer_start, narrow.layer_end) == (2, 3) and narrow.identity != whole.identity
    assert read([(a, 1.5)], N_EMBD, N_LAYER).identity != whole.identity
    with pytest.raises(ControlVectorError, match=r"the last layer is 5, but this model's layers that can be steered are 1\.\.4"):
        read([(a, 1.0)], N_EMBD, N_LAYER, [1, 5])


@pytest.mark.parametrize("directions,kw,message", [
    ({0: vec(1)}, {}, r"direction\.0 is for layer 0, but this model's layers that can be steered are 1\.\.4"),
    ({5: vec(1)}, {}, r"direction\.5 is for layer 5"),
    ({1: np.ones(N_EMBD + 1)}, {}, r"direction\.1 has shape \[9\], but this model is 8 wide"),
    ({1: vec(1)}, {"dtype": np.float16}, r"direction\.1 is F16, not F32"),
    ({1: vec(1)}, {"names": {1: "steer.1"}}, r"tensor 'steer\.1' is not a direction"),
    ({1: np.ones((2, N_EMBD))}, {}, r"direction\.1 has shape \[8, 2\]"),
])
def test_a_file_that_cannot_steer_the_model_is_refused_by_name(tmp_path, directions, kw, message):
    path = write_control_vector(tmp_path / "bad.gguf", directions, **kw)
    with pytest.raises(ControlVectorError, match=r"control vector bad\.gguf: " + message):
        read([(path, 1.0)], N_EMBD, N_LAYER)


def test_a_missing_empty_or_unreadable_file_is_refused(tmp_path):
    with pytest.raises(ControlVectorError, match="control vector file not found: .*gone.gguf"):
        read([(tmp_path / "gone.gguf", 1.0)], N_EMBD, N_LAYER)
    (tmp_path / "text.gguf").write_text("not a gguf")
    with pytest.raises(ControlVectorError, match="control vector text.gguf is not a readable GGUF file"):
        read([(tmp_path / "text.gguf", 1.0)], N_EMBD, N_LAYER)
    empty = write_control_vector(tmp_path / "empty.gguf", {})
    with pytest.raises(ControlVectorError, match="control vector empty.gguf has no direction tensors"):
        read([(empty, 1.0)], N_EMBD, N_LAYER)


def test_a_one_layer_model_has_nothing_to_steer(tmp_path):
    a = write_control_vector(tmp_path / "a.gguf", {1: vec(1)})
    with pytest.raises(ControlVectorError, match="none after layer 0"):
        read([(a, 1.0)], N_EMBD, 1)
