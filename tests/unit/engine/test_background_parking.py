"""Background (batch) sequences give their slot to interactive ones (engine/priority.py), on the
real SmolLM2 with one slot: the background sequence is parked (its KV state to host memory) and
resumes from it when the slot is free again, its answer, sampled with a seed and a repetition
penalty, the very one it gets alone; a parked sequence can be cancelled and ends at a shutdown;
with preempt off, or no host memory for the state, the interactive one waits; the time a
background sequence waits out of a slot does not count against its deadline."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

from appliance.engine import priority
from appliance.engine.runner import Failed, Finished, GenerationRequest, TextDelta
from appliance.engine.sampling import SamplingParams

EOS_OFF = SamplingParams(temperature=0.8, seed=11, repeat_penalty=1.1, logit_bias={2: -100.0})


class Answer:
    """A sink that gathers a sequence's text and says when it has `after` tokens, and when it ended."""

    def __init__(self, after: int = 0, ends: list | None = None):
        self.ends = ends  # where it puts itself when it ends (the order answers end in)
        self.text: list[str] = []
        self.end: Finished | Failed | None = None
        self.generated = 0
        self.after = after
        self.started, self.ended = threading.Event(), threading.Event()

    def __call__(self, event) -> None:
        if isinstance(event, TextDelta):
            self.text.append(event.text)
            self.generated = event.generated
            if self.generated >= self.after:
                self.started.set()
        elif isinstance(event, (Finished, Failed)):
            self.end = event
            if self.ends is not None:
                self.ends.append(self)
            self.ended.set()

    def wait(self) -> str:
        assert self.ended.wait(60)
        assert isinstance(self.end, Finished), self.end
        return "".join(self.text)


def in_background(fn, *args):
    """Call fn as a batch's request is made: with background priority in its context."""
    ctx = contextvars.copy_context()
    ctx.run(priority.background.set, True)
    return ctx.run(fn, *args)


def story(runner, max_tokens: int = 160) -> GenerationRequest:
    prompt = runner.vocab.tokenize("Once upon a time, in a village by the sea,", add_special=True,
                                   parse_special=False)
    return GenerationRequest(prompt=prompt, max_tokens=max_tokens, sampling=EOS_OFF, save_conversation=False)


def quick(runner) -> GenerationRequest:
    prompt = runner.vocab.tokenize("The capital of France is", add_special=True, parse_special=False)
    return GenerationRequest(prompt=prompt, max_tokens=6, sampling=SamplingParams(temperature=0.0),
                             save_conversation=False)


def test_a_parked_sequence_resumes_exactly_where_it_stopped(one_model_manager):
    runner = one_model_manager.load("m")
    alone = Answer()
    runner.submit(story(runner), alone)
    expected = alone.wait()

    batch, chat = Answer(after=20), Answer()
    in_background(runner.submit, story(runner), batch)
    assert batch.started.wait(30)
    runner.submit(quick(runner), chat)  # one slot, held by the batch's sequence
    chat.wait()
    assert runner.stats["background_preemptions"] == 1
    assert not batch.ended.is_set()  # the chat answer came in the middle of the batch's
    assert batch.wait() == expected and batch.end.completion_tokens == 160
    assert runner.background_counts() == {"running": 0, "queued": 0, "parked": 0, "parked_bytes": 0}


def test_a_parked_sequence_holds_its_state_until_cancelled(one_model_manager):
    runner = one_model_manager.load("m")
    batch, chat = Answer(after=10), Answer(after=1)
    handle = in_background(runner.submit, story(runner), batch)
    assert batch.started.wait(30)
    long_chat = story(runner, max_tokens=400)
    runner.submit(long_chat, chat)
    assert chat.started.wait(30)
    counts = runner.background_counts()
    assert counts["parked"] == 1 and counts["parked_bytes"] > 100_000  # ~20 positions of 30 layers' K and V
    handle.cancel()
    assert batch.ended.wait(30)
    assert isinstance(batch.end, Failed) and batch.end.kind == "cancelled"
    assert runner.background_counts()["parked"] == 0
    assert chat.wait()


def test_a_parked_sequence_ends_at_a_shutdown(one_model_manager):
    runner = one_model_manager.load("m")
    batch, chat = Answer(after=10), Answer(after=1)
    in_background(runner.submit, story(runner), batch)
    assert batch.started.wait(30)
    runner.submit(story(runner, max_tokens=400), chat)
    assert chat.started.wait(30)
    assert runner.background_counts()["parked"] == 1
    one_model_manager.stop()
    assert batch.ended.wait(30) and chat.ended.wait(30)
    assert isinstance(batch.end, Failed) and batch.end.kind == "shutdown"


@pytest.fixture
def no_preempt(one_model_manager):
    runner = one_model_manager.load("m")
    runner.preempt_background = False
    return runner


def chat_waits_for_the_batch(runner) -> None:
    """A chat sequence sent while a batch's holds the only slot ends after it."""
    ends: list[Answer] = []
    batch, chat = Answer(after=10, ends=ends), Answer(ends=ends)
    in_background(runner.submit, story(runner, max_tokens=60), batch)
    assert batch.started.wait(30)
    runner.submit(quick(runner), chat)
    batch.wait()
    chat.wait()
    assert ends == [batch, chat]
    assert runner.stats["background_preemptions"] == 0


def test_without_preempt_the_interactive_sequence_waits(no_preempt):
    chat_waits_for_the_batch(no_preempt)


def test_waiting_for_a_slot_does_not_count_against_a_background_deadline(no_preempt):
    runner = no_preempt
    ends: list[Answer] = []
    chat, batch = Answer(after=1, ends=ends), Answer(ends=ends)
    runner.submit(story(runner, max_tokens=400), chat)
    assert chat.started.wait(30)
    t0 = time.monotonic()
    late = quick(runner)
    late.deadline = t0 + 2.0
    in_background(runner.submit, late, batch)
    batch.wait()
    assert ends == [chat, batch] and time.monotonic() - t0 > 2.0  # it ran after its deadline had passed


def test_a_state_the_host_has_no_room_for_is_not_parked(one_model_manager):
    """The room comes from the host's free memory (less vram.reserve_mb); with none, the
    interactive sequence waits for the slot, and the decline is counted once."""
    runner = one_model_manager.load("m")
    assert runner.park_room() > 0  # the manager's: this host's free memory beyond the reserve
    runner.park_room = lambda: 0
    chat_waits_for_the_batch(runner)
    assert runner.stats["background_parks_declined"] == 1
