"""The model janitor's pace: every 0.25 s while a model works, loads or is asked for; while all are
idle it sleeps until the first keep-alive runs out, at most 2 s (an idle appliance was woken four
times a second, each pass reading the host's memory: about 1.4 % of a core here). A request that
takes a model wakes it at once, and a keep-alive still ends on time.

Real manager and model (SmolLM2, generic strategy)."""

from __future__ import annotations

import asyncio
import threading
import time

from appliance.engine.manager import JANITOR_BUSY_S, JANITOR_IDLE_S
from appliance.engine.runner import Failed, Finished, GenerationRequest


def _passes(manager) -> list[float]:
    """The times of the janitor's passes from now on (each pass starts with the prefix spill)."""
    seen: list[float] = []
    spill = manager._spill_prefixes
    manager._spill_prefixes = lambda: (seen.append(time.monotonic()), spill())[1]
    return seen


def test_an_idle_appliance_is_woken_rarely_and_a_request_wakes_the_janitor(one_model_manager):
    manager = one_model_manager
    manager.load("m")
    time.sleep(0.5)  # the load's last busy passes
    assert manager._janitor_wait() == JANITOR_IDLE_S  # the keep-alive (300 s) is far off
    seen = _passes(manager)
    time.sleep(4.5)
    assert 1 <= len(seen) <= 3, seen  # 18 passes at the busy pace
    before = len(seen)
    asked = time.monotonic()
    asyncio.run(manager.ready_runner("m"))  # a request takes the model: a pass now, then the busy pace
    deadline = time.monotonic() + 1
    while len(seen) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(seen) > before and seen[before] - asked < 0.2, (seen, asked)
    assert manager._janitor_wait() == JANITOR_BUSY_S  # being prepared for: its prompt may still come


def _generate(runner, max_tokens: int, ended: threading.Event) -> None:
    prompt = runner.vocab.tokenize("Count to fifty:", add_special=True, parse_special=False)
    runner.submit(GenerationRequest(prompt=prompt, max_tokens=max_tokens, save_conversation=False),
                  lambda event: ended.set() if isinstance(event, (Finished, Failed)) else None)


def test_the_pace_is_busy_while_a_model_generates(one_model_manager):
    runner = one_model_manager.load("m")
    ended = threading.Event()
    _generate(runner, 64, ended)
    deadline = time.monotonic() + 10
    while not runner.running() and not ended.is_set() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert one_model_manager._janitor_wait() == JANITOR_BUSY_S
    assert ended.wait(60)


def test_a_keep_alive_ends_on_time_though_the_janitor_was_idle(one_model_manager):
    """The janitor sleeps its idle 2 s; a request asks keep_alive 0.8 s (as Ollama's keep_alive
    does) and the model goes 0.8 s after the answer, not up to 2 s later."""
    manager = one_model_manager
    manager.load("m")
    time.sleep(0.5)
    assert manager._janitor_wait() == JANITOR_IDLE_S
    manager.ask_keep_alive("m", 0.8)
    runner = asyncio.run(manager.ready_runner("m"))
    ended = threading.Event()
    _generate(runner, 4, ended)
    assert ended.wait(60)
    done = time.monotonic()
    assert 0.4 < manager._janitor_wait() <= 0.8  # until the keep-alive runs out
    while manager.runners["m"].state != "unloaded" and time.monotonic() < done + 3:
        time.sleep(0.02)
    assert manager.runners["m"].state == "unloaded"
    assert 0.75 < time.monotonic() - done < 0.8 + JANITOR_BUSY_S + 0.2
    assert manager._janitor_wait() == JANITOR_IDLE_S
