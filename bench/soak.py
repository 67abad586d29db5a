"""Soak test: every kind of request at once, for a long time, against one `eie serve`, then checks
that the server came back to where it started.

`bench/load.py` measures throughput under plain chat and completions. This one runs what an
appliance meets over days, mixed and concurrent: streamed and whole chat on both models, tool
calls, JSON Schema answers, scored prompts, n=2, streams the client drops, the Responses API
(stored, chained, read back, deleted), Anthropic's and Ollama's APIs, groups (parallel, chain,
fanout asked as a model), a LoRA adapter of one model beside the model itself (their sets take
turns on one context), malformed bodies, and an admin loop that converts KV caches live,
flushes the prefix cache, reloads the config and polls every status endpoint.

Every answer is checked (a 200 must be whole and of its kind; a refusal must be the designed
one in its envelope). At the end, with the KV types back where they were and no client left:
- no sequence runs or waits, and the in-flight gauge is back to the scrape itself;
- open file descriptors and threads are back to their level after the warm-up;
- resident memory at rest (no client, the configured KV types, under `--churn` no model
  loaded) grew less than 5 % from halfway to the end;
- the greedy answers asked before the run come back the same;
- the audit trail verifies, and SIGTERM ends the process with 0.

With `--churn`, the strategy is `generic` instead (models load on demand, unloaded after 4 s
idle) and the clients ask one model at a time, switching every 20 s, so each model is unloaded
and loaded again about every 40 s; groups and KV conversions are left out (they would keep both
models loaded), and the loads are counted.

Usage: .venv/bin/python bench/soak.py [--seconds 600] [--clients 8] [--churn] [--json bench/results/soak.json]
Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Awaitable, Callable

import httpx
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from eie_server import EIE_CMD, EieServer  # noqa: E402
from lora_adapter import write_lora  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["smollm2-135m", "gemma3-270m"]
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}, "why": {"type": "string", "maxLength": 40}},
          "required": ["answer", "why"], "additionalProperties": False}
GREEDY = [{"role": "user", "content": "List the planets of the solar system."}]


PHASE_S = 20  # --churn: how long the clients stay on one model
GROUP_KINDS = ("group_parallel", "group_chain", "group_as_model")
ADAPTER = "smollm2-tuned"  # a LoRA adapter of smollm2-135m (models[].lora): its sets take turns with the model's


def config_for(workdir: Path, churn: bool = False) -> dict:
    preset = yaml.safe_load((ROOT / "presets" / "fixed-appliance.yaml").read_text())
    if churn:
        preset["policy"] = {"strategy": "generic", "keep_alive_s": 4}
    preset["model_dir"] = str((ROOT / "presets" / preset["model_dir"]).resolve())
    if not churn:  # one model at a time there: an adapter's requests would load its model
        smol = next(m for m in preset["models"] if m["name"] == MODELS[0])
        write_lora(Path(preset["model_dir"]) / smol["path"], workdir / "tuned-lora.gguf", rank=8, strength=0.3)
        smol["lora"] = [{"name": ADAPTER, "path": str(workdir / "tuned-lora.gguf")}]
    preset["server"] = {"state_dir": str(workdir / "state"), "cache_dir": str(workdir / "cache"),
                        "responses": {"max_entries": 200}}
    preset["audit"] = {"path": "audit.log"}
    kv = preset.setdefault("inference", {}).setdefault("kv_cache", {})
    kv["prefix"] = {"ram_mb": 16}  # full early: the rest of the run is the steady state
    preset["groups"] = [
        {"name": "pair", "type": "parallel", "models": MODELS, "fallback": "partial", "timeout_ms": 120000},
        {"name": "chain", "type": "sequential", "models": MODELS, "fallback": "strict",
         "prompt_templates": [None, "Say this in other words: {input}"]},
        {"name": "vote", "type": "fanout", "models": ["smollm2-135m"], "samples": 2, "select": "consensus"},
    ]
    return preset


class Tally:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.status: Counter[str] = Counter()
        self.bad: list[str] = []
        self.bad_count = 0

    def fail(self, kind: str, what: str) -> None:
        self.bad_count += 1
        if len(self.bad) < 30:
            self.bad.append(f"{kind}: {what}"[:400])


class Check(Exception):
    """An answer that is not what its request must get."""


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Check(what)


def sse_data(lines: list[str]) -> list[str]:
    return [x[6:] for x in lines if x.startswith("data: ")]


async def chat(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 24, "messages": [{"role": "user", "content": f"Name a fruit. ({i})"}]})
    if r.status_code == 200:
        body = r.json()
        expect(body["choices"][0]["finish_reason"] in ("stop", "length"), f"finish {body['choices'][0]}")
        expect(body["usage"]["completion_tokens"] > 0, "no tokens")
    return r.status_code


async def chat_stream(c: httpx.AsyncClient, model: str, i: int) -> int:
    body = {"model": model, "max_tokens": 32, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Write one sentence about rivers. ({i})"}]}
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = sse_data([x async for x in r.aiter_lines()])
        if r.status_code == 200:
            expect(lines[-1] == "[DONE]", f"no [DONE]: {lines[-2:]}")
            chunks = [json.loads(x) for x in lines[:-1]]
            expect(any(ch["choices"] and ch["choices"][0].get("finish_reason") for ch in chunks), "no finish")
            expect(chunks[-1].get("usage", {}).get("completion_tokens", 0) > 0, "no usage")
        return r.status_code


async def dropped_stream(c: httpx.AsyncClient, model: str, i: int) -> int:
    body = {"model": model, "max_tokens": 200, "stream": True,
            "messages": [{"role": "user", "content": f"Tell a long story about a lighthouse. ({i})"}]}
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        n = 0
        async for line in r.aiter_lines():
            n += line.startswith("data: ")
            if n >= 3:
                break  # leaving the block closes the connection mid-stream
        return r.status_code


async def tool_call(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 80, "tools": [TOOL], "tool_choice": "required",
        "messages": [{"role": "user", "content": f"What is the weather in Oslo? ({i})"}]})
    if r.status_code == 200:
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "tool_calls":
            args = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
            expect(set(args) == {"city", "unit"} and args["unit"] in ("c", "f"), f"arguments {args}")
        else:
            expect(choice["finish_reason"] == "length", f"finish {choice['finish_reason']}")
    return r.status_code


async def json_schema(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 60,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        "messages": [{"role": "user", "content": f"What is {i % 9} plus 2? Answer in JSON."}]})
    if r.status_code == 200:
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            data = json.loads(choice["message"]["content"])
            expect(isinstance(data["answer"], int) and len(data["why"]) <= 40, f"answer {data}")
    return r.status_code


async def scored(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/v1/completions", json={"model": model, "prompt": f"The capital of France is ({i})",
                                              "max_tokens": 4, "echo": True, "logprobs": 1})
    if r.status_code == 200:
        lp = r.json()["choices"][0]["logprobs"]
        expect(lp["token_logprobs"][0] is None and len(lp["tokens"]) > 4, f"logprobs {str(lp)[:120]}")
    return r.status_code


async def two_choices(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 16, "n": 2, "temperature": 0.9, "seed": i,
        "messages": [{"role": "user", "content": "Name an animal."}]})
    if r.status_code == 200:
        expect(sorted(ch["index"] for ch in r.json()["choices"]) == [0, 1], "not two choices")
    return r.status_code


async def responses(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/v1/responses", json={"model": model, "input": f"Say a colour. ({i})", "max_output_tokens": 12})
    if r.status_code != 200:
        return r.status_code
    first = r.json()
    expect(first["status"] in ("completed", "incomplete"), f"status {first['status']}")
    r = await c.post("/v1/responses", json={"model": model, "input": "And another one.", "max_output_tokens": 12,
                                            "previous_response_id": first["id"]})
    if r.status_code != 200:
        return r.status_code
    second = r.json()["id"]
    g = await c.get(f"/v1/responses/{second}")
    expect(g.status_code == 200 and g.json()["id"] == second, f"read back {g.status_code}")
    items = await c.get(f"/v1/responses/{second}/input_items")
    listed = items.json()["data"] if items.status_code == 200 else []
    expect([x["content"][0]["text"] for x in listed] == ["And another one."], f"input items {items.text[:160]}")
    d = await c.delete(f"/v1/responses/{first['id']}")
    expect(d.status_code == 200 and d.json()["deleted"], f"delete {d.status_code}")
    gone = await c.get(f"/v1/responses/{first['id']}")
    expect(gone.status_code == 404, f"deleted response read back: {gone.status_code}")
    return 200


async def anthropic(c: httpx.AsyncClient, model: str, i: int) -> int:
    body = {"model": model, "max_tokens": 24, "stream": True,
            "messages": [{"role": "user", "content": f"Name a tree. ({i})"}]}
    async with c.stream("POST", "/v1/messages", json=body) as r:
        text = "".join([x async for x in r.aiter_text()])
        if r.status_code == 200:
            expect("event: message_stop" in text, f"no message_stop: {text[-200:]}")
        return r.status_code


async def ollama(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/api/chat", json={"model": model, "stream": False, "options": {"num_predict": 16},
                                        "messages": [{"role": "user", "content": f"Name a city. ({i})"}]})
    if r.status_code == 200:
        expect(r.json()["done"] is True, "not done")
    return r.status_code


async def group_parallel(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/v1/batch/execute", json={"group": "pair", "max_tokens": 16,
                                                 "messages": [{"role": "user", "content": f"Name a bird. ({i})"}]})
    if r.status_code == 200:
        body = r.json()
        expect(len(body["members"]) == 2, f"members {body['members']}")
    return r.status_code


async def group_chain(c: httpx.AsyncClient, model: str, i: int) -> int:
    r = await c.post("/v1/chain/execute", json={"group": "chain", "max_tokens": 16,
                                                 "messages": [{"role": "user", "content": f"Name a river. ({i})"}]})
    if r.status_code == 200:
        body = r.json()
        expect(body["complete"] and body["output"], f"chain {str(body)[:200]}")
    return r.status_code


async def group_as_model(c: httpx.AsyncClient, model: str, i: int) -> int:
    body = {"model": "vote", "max_tokens": 12, "stream": True,
            "messages": [{"role": "user", "content": f"Yes or no: is water wet? ({i})"}]}
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = sse_data([x async for x in r.aiter_lines()])
        if r.status_code == 200:
            expect(lines and lines[-1] == "[DONE]", f"no [DONE]: {lines[-2:]}")
        return r.status_code


async def malformed(c: httpx.AsyncClient, model: str, i: int) -> int:
    bad = [({"model": model, "messages": "hi"}, "messages"),
           ({"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}, "max_tokens"),
           ({"model": model, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
           ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, "model")]
    body, field = bad[i % len(bad)]
    r = await c.post("/v1/chat/completions", json=body)
    expect(r.status_code in (400, 404) and field in (r.json()["error"].get("param") or ""),
           f"{field}: {r.status_code} {r.text[:160]}")
    return r.status_code


async def adapter_chat(c: httpx.AsyncClient, model: str, i: int) -> int:
    """smollm2's LoRA adapter, whatever the model of the turn (streamed every other time)."""
    if i % 2:
        return await chat_stream(c, ADAPTER, i)
    return await chat(c, ADAPTER, i)


KINDS: dict[str, Callable[[httpx.AsyncClient, str, int], Awaitable[int]]] = {
    "adapter": adapter_chat, "chat": chat, "chat_stream": chat_stream, "dropped_stream": dropped_stream, "tool_call": tool_call,
    "json_schema": json_schema, "scored": scored, "two_choices": two_choices, "responses": responses,
    "anthropic": anthropic, "ollama": ollama, "group_parallel": group_parallel, "group_chain": group_chain,
    "group_as_model": group_as_model, "malformed": malformed,
}


async def client_loop(base: str, idx: int, t: Tally, until: float, phased_from: float | None = None) -> None:
    """Requests of every kind in turn; with `phased_from`, all on one model per PHASE_S and no groups."""
    names = [k for k in KINDS if phased_from is None or k not in (*GROUP_KINDS, "adapter")]
    n = idx * 5
    async with httpx.AsyncClient(base_url=base, timeout=600) as c:
        while time.monotonic() < until:
            kind = names[n % len(names)]
            if phased_from is None:
                model = MODELS[(n // len(names)) % len(MODELS)]
            else:
                model = MODELS[int((time.monotonic() - phased_from) // PHASE_S) % len(MODELS)]
            try:
                status = await KINDS[kind](c, model, n)
            except Check as e:
                t.fail(kind, str(e))
                status = -1
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                t.fail(kind, f"{type(e).__name__}: {e}")
                status = -2
            t.kinds[kind] += 1
            t.status[str(status)] += 1
            if status >= 500 and status != 503:
                t.fail(kind, f"HTTP {status}")
            n += 1


async def warm_up(base: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=600) as c:
        for i, kind in enumerate(KINDS):
            for model in MODELS:
                try:
                    await KINDS[kind](c, model, i)
                except (Check, httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                    pass  # the run itself checks every answer


class Admin:
    """Polls every status endpoint and changes things under the clients' feet."""

    def __init__(self, base: str, original: dict[str, tuple[str, str]], t: Tally, convert: bool = True) -> None:
        self.base, self.original, self.t, self.converts = base, original, t, convert
        self.converted = False
        self.actions: Counter[str] = Counter()

    async def loop(self, until: float) -> None:
        step = 0
        async with httpx.AsyncClient(base_url=self.base, timeout=300) as c:
            while time.monotonic() < until:
                for path in ("/health", "/v1/admin/vram/status", "/v1/admin/scheduling/status",
                             "/v1/admin/kv/status", "/metrics", "/v1/models"):
                    r = await c.get(path)
                    self.actions["poll"] += 1
                    if r.status_code != 200:
                        self.t.fail("admin", f"{path}: {r.status_code} {r.text[:160]}")
                if step % 6 == 3 and self.converts:
                    await self.convert(c, not self.converted)
                if step % 12 == 5:
                    await self.act(c, "/v1/admin/kv/flush", {})
                if step % 12 == 9:
                    await self.act(c, "/v1/admin/config/reload", None)
                step += 1
                await asyncio.sleep(5)
            if self.converted:
                await self.convert(c, False)

    async def act(self, c: httpx.AsyncClient, path: str, body: dict | None) -> None:
        r = await c.post(path, json=body) if body is not None else await c.post(path)
        self.actions[path.rsplit("/", 1)[-1]] += 1
        if r.status_code != 200:
            self.t.fail("admin", f"{path}: {r.status_code} {r.text[:200]}")

    async def convert(self, c: httpx.AsyncClient, away: bool) -> None:
        for model, (k, v) in self.original.items():
            mode = ("q8_0" if k == "f16" else "f16") if away else k
            await self.act(c, "/v1/admin/kv/convert", {"model": model, "mode": mode})
        self.converted = away


async def greedy_answers(base: str) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=base, timeout=300) as c:
        out = {}
        served = {m["id"] for m in (await c.get("/v1/models")).json()["data"]}
        for m in [*MODELS, *([ADAPTER] if ADAPTER in served else [])]:
            r = await c.post("/v1/chat/completions", json={"model": m, "messages": GREEDY, "max_tokens": 40,
                                                            "temperature": 0})
            out[m] = r.json()["choices"][0]["message"]["content"]
        return out


def rest(base: str, unload: bool) -> None:
    """Wait until no sequence runs; with `unload`, unload every model (an idle one may be in use
    for a moment more: 409 is retried)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        g = gauges(base)
        if g.get("eie_running_sequences", 0) == 0 and g.get("eie_queue_depth", 0) == 0:
            break
        time.sleep(0.5)
    for model in MODELS if unload else ():
        while time.monotonic() < deadline:
            r = httpx.post(base + "/v1/admin/models/unload", json={"model": model}, timeout=60)
            if r.status_code == 200:
                break
            time.sleep(0.5)
    time.sleep(2)


def gauges(base: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    wanted = ("eie_running_sequences", "eie_queue_depth", "eie_in_flight_requests", "eie_model_loads_total",
              "eie_model_unloads_total", "eie_model_evictions_total")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name in wanted:
                out[s.name] = out.get(s.name, 0) + s.value
    return out


def process_counts(proc: psutil.Process) -> dict[str, int]:
    return {"fds": proc.num_fds(), "threads": proc.num_threads()}


def run(seconds: float, clients: int, workdir: Path, churn: bool = False) -> dict:
    srv = EieServer(config_for(workdir, churn), workdir)
    proc = psutil.Process(srv.proc.pid)
    t = Tally()
    peak = [0]
    at_rest: list[float] = []
    try:
        before = asyncio.run(greedy_answers(srv.base))  # under --churn this loads both models
        vram = httpx.get(srv.base + "/v1/admin/vram/status", timeout=30).json()
        original = {m["name"]: (m["kv_type_k"], m["kv_type_v"]) for m in vram["models"]}
        # every kind once on each model first, so that lazily made things (threads, files) exist
        asyncio.run(warm_up(srv.base))
        start_counts = process_counts(proc)
        loads_before = gauges(srv.base).get("eie_model_loads_total", 0)
        admin = Admin(srv.base, original, t, convert=not churn)

        async def sample(until: float) -> None:
            while time.monotonic() < until:
                peak[0] = max(peak[0], proc.memory_info().rss)
                await asyncio.sleep(1)

        async def half() -> None:
            now = time.monotonic()
            until = now + seconds / 2
            await asyncio.gather(sample(until), admin.loop(until),
                                 *(client_loop(srv.base, i, t, until, now if churn else None) for i in range(clients)))

        t0 = time.monotonic()
        for _ in range(2):
            # the same state after each half: no client, the configured KV types, and under
            # --churn no model loaded; the prefix cache's RAM tier and the stored responses are
            # full from the first half on
            asyncio.run(half())
            rest(srv.base, churn)
            at_rest.append(round(proc.memory_info().rss / 2**20, 1))
        wall = time.monotonic() - t0
        after = asyncio.run(greedy_answers(srv.base))
        g = gauges(srv.base)
        end_counts = process_counts(proc)
    finally:
        code = srv.stop()
    verify = subprocess.run([*EIE_CMD, "audit", "verify", str(workdir / "state" / "audit.log")],
                            capture_output=True, text=True)
    growth = round((at_rest[1] - at_rest[0]) / at_rest[0] * 100, 2)
    checks = {
        "answers_checked": t.bad_count == 0,
        "no_running_or_queued": g.get("eie_running_sequences", 1) == 0 and g.get("eie_queue_depth", 1) == 0,
        "in_flight_only_the_scrape": g.get("eie_in_flight_requests", 9) <= 1,
        "fds_back": end_counts["fds"] <= start_counts["fds"] + 2,
        # asyncio's default executor (admin and rendering calls off the event loop) keeps the
        # threads it grew to, up to min(32, cores + 4)
        "threads_back": end_counts["threads"] <= start_counts["threads"] + min(32, (os.cpu_count() or 1) + 4),
        "rss_growth_under_5_percent": growth < 5,
        "greedy_answers_same": before == after,
        "audit_verifies": verify.returncode == 0,
        "exit_code_0": code == 0,
    }
    if churn:  # each phase change unloads one model and loads it again
        checks["models_reloaded"] = g.get("eie_model_loads_total", 0) - loads_before >= seconds // (2 * PHASE_S)
    return {
        "mode": "churn (generic)" if churn else "fixed-appliance",
        "model_loads_during_run": g.get("eie_model_loads_total", 0) - loads_before,
        "seconds": round(wall, 1), "clients": clients, "cpu_cores": os.cpu_count(),
        "requests": sum(t.kinds.values()), "by_kind": dict(sorted(t.kinds.items())),
        "by_status": dict(sorted(t.status.items())), "admin_actions": dict(sorted(admin.actions.items())),
        "rss_mib_at_rest_halfway": at_rest[0], "rss_mib_at_rest_end": at_rest[1], "rss_growth_percent": growth,
        "rss_mib_peak": round(peak[0] / 2**20, 1),
        "process_after_warmup": start_counts, "process_at_end": end_counts, "gauges_at_end": g,
        "greedy_before": before, "greedy_after": after,
        "audit_verify": (verify.stdout.strip().splitlines() or [verify.stderr[-300:]])[-1],
        "failures": t.bad, "failure_count": t.bad_count, "checks": checks, "pass": all(checks.values()),
    }


def table(result: dict) -> str:
    rows = [f"{k:28s} {v}" for k, v in result["by_kind"].items()]
    rows += [f"{k:28s} {'ok' if v else 'FAILED'}" for k, v in result["checks"].items()]
    rows.append(f"{'rss MiB at rest (half → end)':28s} {result['rss_mib_at_rest_halfway']} → "
                f"{result['rss_mib_at_rest_end']} ({result['rss_growth_percent']} %)")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--churn", action="store_true", help="generic strategy, one model at a time")
    ap.add_argument("--json", type=Path, help="write the result here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="eie-soak-") as d:
        result = run(args.seconds, args.clients, Path(d), args.churn)
    print(table(result))
    if result["failures"]:
        print("\n".join(result["failures"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
