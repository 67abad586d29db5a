"""A KV type change frees the old context before it makes the new one (engine/context_swap.py,
staged). When neither the new context nor the old one can then be made (the memory
the old one freed went elsewhere meanwhile, which cannot be brought about on demand: here
`native.new_context` fails), the model fails cleanly: its live sequence ends with an error, the
change's caller gets the reason, the runner thread ends and lets go of the weights, and the
server can still stop it. (The change that can put its old types back is tested for real in
tests/integration/test_kv_migration_memory.py.)"""

from __future__ import annotations

import threading

import pytest

from appliance.engine import native
from appliance.engine.runner import Failed, GenerationRequest, NotReady, TextDelta


def test_a_kv_change_that_can_make_no_context_fails_the_model_cleanly(one_model_manager, monkeypatch):
    manager = one_model_manager
    runner = manager.load("m")
    events: list = []
    generating, ended = threading.Event(), threading.Event()

    def sink(event) -> None:
        events.append(event)
        if isinstance(event, TextDelta):
            generating.set()
        else:
            ended.set()

    prompt = runner.vocab.tokenize("Once upon a time", add_special=True, parse_special=False)
    runner.submit(GenerationRequest(prompt=prompt, max_tokens=400), sink)
    assert generating.wait(30)
    calls: list[tuple[str, str]] = []

    def no_memory(loaded, type_k: str, type_v: str):
        calls.append((type_k, type_v))
        raise native.LoadError("failed to allocate buffer for kv cache")

    monkeypatch.setattr(native, "new_context", no_memory)
    with runner._cond:  # both queued before the runner looks: they run as one batch of commands
        change = runner.change_kv_types("q8_0", "q8_0", "test")
        flush = runner.flush_prefix_cache()
    with pytest.raises(RuntimeError, match="the old types could not come back either"):
        change.result(timeout=30)
    with pytest.raises(NotReady, match="could not come back"):  # never run on a model without a context
        flush.result(timeout=30)
    assert calls == [("q8_0", "q8_0"), ("f16", "f16")]  # the new types, then the old ones
    assert ended.wait(30)
    assert isinstance(events[-1], Failed) and "could not come back" in events[-1].message
    assert runner.state == "failed" and "q8_0" in runner.error
    runner._thread.join(30)
    assert not runner._thread.is_alive()
    assert runner.loaded is None  # the weights went with the context
    assert manager.states()["m"][0] == "failed"
    monkeypatch.undo()
    again = manager.load("m")  # on demand, the model loads again in a runner of its own
    assert again is not runner and again.state == "ready"
