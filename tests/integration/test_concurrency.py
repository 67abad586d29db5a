"""Continuous batching: concurrent streams on one model are independent and match solo runs."""

from __future__ import annotations

import asyncio

import httpx
import openai

PROMPTS = [
    "Write one sentence about cats.",
    "Name three colors.",
    "What is two plus two?",
    "Say hello in French.",
    "Describe the sea in five words.",
    "List four fruits.",
    "What day comes after Monday?",
    "Give me a short motto.",
]


async def _stream(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> str:
    stream = await client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": prompt}],
        temperature=0, max_tokens=max_tokens, stream=True,
    )
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def test_eight_concurrent_streams_match_solo_runs(main_server):
    async def run() -> tuple[list[str], list[str]]:
        client = openai.AsyncOpenAI(base_url=main_server.base + "/v1", api_key="unused", max_retries=0)
        solo = [await _stream(client, p, 40) for p in PROMPTS]
        together = await asyncio.gather(*(_stream(client, p, 40) for p in PROMPTS))
        await client.close()
        return solo, list(together)

    solo, together = asyncio.run(run())
    assert all(s.strip() for s in solo)
    assert len(set(solo)) == len(PROMPTS)  # independent answers, not one stream copied
    assert together == solo


def test_long_prompt_prefill_does_not_stall_running_streams(main_server):
    """Chunked prefill: a stream keeps producing tokens while a long prompt is prefilled."""
    long_prompt = " ".join(f"Sentence number {i} talks about the weather and the sea." for i in range(150))

    async def run() -> tuple[list[float], float]:
        async with httpx.AsyncClient(base_url=main_server.base, timeout=120) as http:
            arrivals: list[float] = []
            loop = asyncio.get_running_loop()

            async def streamer() -> None:
                body = {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 120,
                        "temperature": 0, "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            arrivals.append(loop.time())

            async def long_request() -> float:
                await asyncio.sleep(0.3)
                t0 = loop.time()
                r = await http.post("/v1/completions", json={"model": "smollm2-135m", "prompt": long_prompt,
                                                              "max_tokens": 1, "temperature": 0})
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["prompt_tokens"] > 1500
                return loop.time() - t0

            _, prefill_time = await asyncio.gather(streamer(), long_request())
            return arrivals, prefill_time

    arrivals, prefill_time = asyncio.run(run())
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    # The long prefill takes far longer than any single gap between streamed tokens.
    assert max(gaps) < prefill_time * 0.6, (max(gaps), prefill_time)
