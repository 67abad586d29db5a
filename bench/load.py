"""Bounded load test: N concurrent clients for a fixed time against `eie serve` with a preset.

Loopback only, stops by itself. Each client loops over a mix of requests (chat and completions,
streamed and not, on every model of the preset) and checks every answer: a 200 must be complete
(a JSON body with choices and usage, or a stream ending in a finish_reason and [DONE]); 429 and
503 are the designed refusals; anything else, a transport error or a cut-off answer counts as
an error or a lost request. The server's RSS is sampled every second; the growth figure compares
the median RSS of the 10 s around minute 1 with that around minute 2 (scaled to the run length).

Usage: .venv/bin/python bench/load.py [--clients 32] [--seconds 120] [--preset presets/fixed-appliance.yaml]
       [--json bench/results/load.json]
Exit status 0 when: no 5xx other than 503, no lost request, RSS growth under 5%, and the audit
trail (on during the run) verifies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when tests import this file
from eie_server import EIE_CMD, EieServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Write a haiku about the sea.", "What is 17 times 3?", "Name three colours.",
           "Explain what a cache is in one sentence.", "Say hello in French."]


class Tally:
    def __init__(self) -> None:
        self.status: Counter[str] = Counter()
        self.lost = 0
        self.errors: list[str] = []
        self.latency: list[float] = []
        self.tokens = 0

    def bad(self, what: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(what)


async def one(client: httpx.AsyncClient, t: Tally, model: str, kind: str, prompt: str, max_tokens: int) -> None:
    stream = kind.endswith("stream")
    chat = kind.startswith("chat")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.monotonic()
    try:
        if stream:
            async with client.stream("POST", path, json=body) as r:
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
                status = r.status_code
                if status == 200:
                    ok = (lines and lines[-1] == "data: [DONE]" and
                          any('"finish_reason":"' in x for x in lines) and '"usage":{' in lines[-2])
                    if not ok:
                        t.lost += 1
                        t.bad(f"incomplete stream: {lines[-2:]}")
                        return
                    t.tokens += json.loads(lines[-2][6:])["usage"]["completion_tokens"]
        else:
            r = await client.post(path, json=body)
            status = r.status_code
            if status == 200:
                data = r.json()
                if not data.get("choices") or data["choices"][0].get("finish_reason") is None:
                    t.lost += 1
                    t.bad(f"incomplete body: {r.text[:200]}")
                    return
                t.tokens += data["usage"]["completion_tokens"]
            else:
                r.json()["error"]  # every refusal is an error envelope
    except (httpx.HTTPError, ValueError, KeyError) as e:
        t.lost += 1
        t.bad(f"{type(e).__name__}: {e}")
        return
    t.status[str(status)] += 1
    if status == 200:
        t.latency.append(time.monotonic() - t0)
    elif status not in (429, 503):
        t.bad(f"{status} on {path}")


async def client_loop(base: str, idx: int, t: Tally, models: list[str], until: float, max_tokens: int) -> None:
    kinds = ["chat", "chat-stream", "completion", "completion-stream"]
    n = idx
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        while time.monotonic() < until:
            await one(client, t, models[n % len(models)], kinds[(n // len(models)) % len(kinds)],
                      PROMPTS[n % len(PROMPTS)] + f" ({idx})", max_tokens)
            n += 1


async def sample_rss(pid: int, until: float, out: list[tuple[float, int]]) -> None:
    proc = psutil.Process(pid)
    t0 = time.monotonic()
    while time.monotonic() < until:
        out.append((time.monotonic() - t0, proc.memory_info().rss))
        await asyncio.sleep(1)


def rss_at(samples: list[tuple[float, int]], at: float) -> int:
    near = [rss for t, rss in samples if abs(t - at) <= 5]
    return int(statistics.median(near)) if near else 0


def scrape(base: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name == "eie_prefix_cache_bytes" and s.labels.get("tier") == "ram":
                out["prefix_ram_bytes"] = out.get("prefix_ram_bytes", 0) + s.value
            if s.name in ("eie_time_to_first_token_seconds_sum", "eie_time_to_first_token_seconds_count",
                          "eie_inter_token_latency_seconds_sum", "eie_inter_token_latency_seconds_count"):
                out[s.name] = out.get(s.name, 0) + s.value
    return out


def run(preset: Path, clients: int, seconds: float, max_tokens: int, workdir: Path, prefix_ram_mb: int = 16) -> dict:
    config = yaml.safe_load(preset.read_text())
    # The prefix cache's RAM tier fills by design up to its cap (256 MiB per model by default);
    # a small cap is full before minute 1, so minute 1 to 2 shows the steady state.
    inference = config.setdefault("inference", {})
    kv = inference.setdefault("kv_cache", {})
    kv["prefix"] = {**kv.get("prefix", {}), "ram_mb": prefix_ram_mb}
    config["model_dir"] = str((preset.parent / config.get("model_dir", ".")).resolve())
    config["server"] = {**config.get("server", {}), "state_dir": str(workdir / "state"),
                        "cache_dir": str(workdir / "cache")}
    config["audit"] = {"path": "audit.log"}
    srv = EieServer(config, workdir)
    proc, base = srv.proc, srv.base
    try:
        models = [m["name"] for m in config["models"]]
        t = Tally()
        rss: list[tuple[float, int]] = []

        async def main() -> None:
            until = time.monotonic() + seconds
            await asyncio.gather(sample_rss(proc.pid, until, rss),
                                 *(client_loop(base, i, t, models, until, max_tokens) for i in range(clients)))

        t0 = time.monotonic()
        asyncio.run(main())
        wall = time.monotonic() - t0
        lat = scrape(base)
        rss_1, rss_2 = rss_at(rss, seconds / 2), rss_at(rss, seconds)
    finally:
        code = srv.stop()
    verify = subprocess.run([*EIE_CMD, "audit", "verify", str(workdir / "state" / "audit.log")],
                            capture_output=True, text=True)
    done = sum(t.status.values())
    server_errors = sum(n for s, n in t.status.items() if s.startswith("5") and s != "503")
    growth = (rss_2 - rss_1) / rss_1 * 100 if rss_1 else float("nan")
    ttft_n = lat.get("eie_time_to_first_token_seconds_count", 0)
    itl_n = lat.get("eie_inter_token_latency_seconds_count", 0)
    result = {
        "preset": str(preset.relative_to(ROOT) if preset.is_relative_to(ROOT) else preset),
        "clients": clients, "seconds": round(wall, 1), "max_tokens": max_tokens, "cpu_cores": os.cpu_count(),
        "requests": done + t.lost, "by_status": dict(sorted(t.status.items())), "lost": t.lost,
        "server_errors_5xx_other_than_503": server_errors,
        "requests_per_s": round(done / wall, 2), "completion_tokens_per_s": round(t.tokens / wall, 1),
        "latency_p50_s": round(statistics.median(t.latency), 3) if t.latency else None,
        "latency_p95_s": round(statistics.quantiles(t.latency, n=20)[-1], 3) if len(t.latency) > 20 else None,
        "ttft_mean_s": round(lat["eie_time_to_first_token_seconds_sum"] / ttft_n, 3) if ttft_n else None,
        "itl_mean_ms": round(lat["eie_inter_token_latency_seconds_sum"] / itl_n * 1000, 1) if itl_n else None,
        "rss_minute_1_mib": round(rss_1 / 2**20, 1), "rss_minute_2_mib": round(rss_2 / 2**20, 1),
        "rss_growth_percent": round(growth, 2), "exit_code": code, "prefix_ram_mb_cap": prefix_ram_mb,
        "prefix_cache_ram_mib_at_end": round(lat.get("prefix_ram_bytes", 0) / 2**20, 1),
        "audit_verify": verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr[-300:],
        "audit_ok": verify.returncode == 0, "errors": t.errors,
    }
    result["pass"] = bool(server_errors == 0 and t.lost == 0 and growth < 5 and verify.returncode == 0
                          and code == 0 and t.status.get("200", 0) > 0)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", type=Path, default=ROOT / "presets" / "fixed-appliance.yaml")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prefix-ram-mb", type=int, default=16, help="prefix cache RAM tier per model")
    ap.add_argument("--json", type=Path, help="write the result here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="eie-load-") as d:
        result = run(args.preset.resolve(), args.clients, args.seconds, args.max_tokens, Path(d), args.prefix_ram_mb)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
