"""The runner's short llama.cpp calls keep the GIL (engine/held_gil.py): the same functions and
types as llama_cpp's bindings, with ctypes' Python-API flag, which skips the GIL release."""

import ctypes

import llama_cpp as lc

from appliance.engine import held_gil, native
from conftest import SMOLLM2

_PYTHONAPI = ctypes._FUNCFLAG_PYTHONAPI


def test_each_binding_keeps_the_gil_and_the_declared_types():
    for name in held_gil.__all__:
        held = getattr(held_gil, name)
        declared = getattr(lc.llama_cpp._lib, "llama_" + name)
        assert held._flags_ & _PYTHONAPI, name
        assert not declared._flags_ & _PYTHONAPI  # ctypes' own binding releases it
        assert held.restype is declared.restype and list(held.argtypes) == list(declared.argtypes), name
        # the same entry point of the same library
        assert ctypes.cast(held, ctypes.c_void_p).value == ctypes.cast(declared, ctypes.c_void_p).value, name


def test_a_held_call_returns_what_the_released_one_does(real_models):
    native.init_backend()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(SMOLLM2).encode(), params)
    try:
        vocab = lc.llama_model_get_vocab(model)
        for token in range(0, lc.llama_vocab_n_tokens(vocab), 97):
            a, b = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
            n = held_gil.token_to_piece(vocab, token, a, 64, 0, True)
            assert n == lc.llama_token_to_piece(vocab, token, b, 64, 0, True)
            assert a.raw[:n] == b.raw[:n]
    finally:
        lc.llama_model_free(model)
