"""Work handed to a runner between two steps (a prefix flush, a KV change, embeddings, a warm-up)
when the model is unloaded at that moment: the caller gets NotReady, never a future that no one
completes. Before, a command queued just before the runner's last step waited forever, and with
it the admin call or the embeddings request (bench/soak.py --churn hung on POST /v1/admin/kv/flush
when keep_alive unloaded the model under it).

The model and runner are real (SmolLM2); the moment is made exact by holding the runner's lock."""

from __future__ import annotations

import concurrent.futures

import pytest

from appliance.engine.runner import GenerationRequest, NotReady


@pytest.fixture
def runner(one_model_manager):
    return one_model_manager.load("m")


def test_work_queued_as_the_runner_stops_fails_with_not_ready(runner):
    assert runner.state == "ready"
    with runner._cond:  # the runner thread waits for this lock: nothing it queued runs meanwhile
        flush = runner.flush_prefix_cache()
        change = runner.change_kv_types("q8_0", "q8_0", "test")
        runner._stopping = True  # what stop() sets, before it joins the thread
        runner._cond.notify_all()
    for fut in (flush, change):
        with pytest.raises(NotReady, match="unloaded"):
            fut.result(timeout=30)
    runner.stop()


def test_work_asked_of_a_stopping_runner_is_refused_at_once(runner):
    with runner._cond:
        runner._stopping = True
        fut = runner.flush_prefix_cache()
    with pytest.raises(NotReady):
        fut.result(timeout=0)  # already settled: nothing was queued
    runner.stop()
    with pytest.raises(NotReady):
        runner.flush_prefix_cache().result(timeout=0)


def test_work_queued_before_the_stop_still_runs(runner):
    fut = runner.flush_prefix_cache()
    assert fut.result(timeout=30) is None
    runner.stop()
    assert isinstance(fut, concurrent.futures.Future) and fut.done()


def test_a_request_submitted_as_the_runner_stops_is_refused(runner):
    """A request that got the runner (its state still ready) and submits once the runner thread
    has taken its last look at the queue: refused, never queued where no one reads it (an Ollama
    request with keep_alive 0 hung for its client's whole timeout when the keep-alive unloaded
    its model between the request taking the runner and submitting)."""
    prompt = runner.vocab.tokenize("Hi", add_special=True, parse_special=False)
    with runner._cond:
        runner._stopping = True
        runner._cond.notify_all()
    runner._thread.join(30)
    assert runner.state == "ready"  # (stop() marks it stopped only after the join and the release)
    with pytest.raises(NotReady):
        runner.submit(GenerationRequest(prompt=prompt, max_tokens=4), lambda event: None)
