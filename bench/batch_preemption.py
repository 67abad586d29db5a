"""An interactive request's latency while a batch holds the model's only slot: with preemption
(the batch's sequence parked, server.batches.preempt: true) against without (the request waits
for the slot, as on a server that runs whatever took the slot to its end), side by side.

One `eie serve` at a time (SmolLM2, one slot, the same threads), alternating per repeat: a batch
of one long request (`--batch-tokens`, end of text suppressed) is submitted, and once it has
decoded 30 tokens a streamed chat request (`--chat-tokens`) is timed: to its first text and to
its end. Also timed: the batch request's own run, which the parking lengthens by the chat
request's run and the state copies. Prints a table and writes bench/results/batch_preemption.json.

    .venv/bin/python bench/batch_preemption.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from eie_server import EieServer

ROOT = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def config(preempt: bool, threads: int, state: Path) -> dict:
    return {"model_dir": str(ROOT / "models"),
            "server": {"state_dir": str(state), "batches": {"concurrent_requests": 1, "preempt": preempt}},
            "models": [{"name": "smol", "path": MODEL, "n_ctx": 1024, "n_parallel": 1, "threads": threads}]}


def sched(client: httpx.Client) -> dict:
    return client.get("/v1/admin/scheduling/status").json()["models"]["smol"]


def one_run(client: httpx.Client, batch_tokens: int, chat_tokens: int) -> dict:
    line = {"custom_id": "long", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smol", "messages": [{"role": "user", "content": "Tell me a long story."}], "temperature": 0,
        "max_tokens": batch_tokens, "logit_bias": {"2": -100}}}
    file = client.post("/v1/files", files={"file": ("in.jsonl", json.dumps(line).encode() + b"\n")},
                       data={"purpose": "batch"}).json()
    before = sched(client)["decode_tokens"]
    t_batch = time.perf_counter()
    batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"}).json()
    while sched(client)["decode_tokens"] - before < 30:
        time.sleep(0.02)
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/chat/completions", json={
            "model": "smol", "messages": [{"role": "user", "content": "Name a colour."}], "stream": True,
            "temperature": 0, "max_tokens": chat_tokens}) as r:
        for chunk in r.iter_lines():
            if first is None and '"content":"' in chunk and '"content":""' not in chunk:
                first = time.perf_counter() - t0
    chat_s = time.perf_counter() - t0
    while (b := client.get(f"/v1/batches/{batch['id']}").json())["status"] not in ("completed", "failed"):
        time.sleep(0.05)
    assert b["request_counts"]["completed"] == 1, b
    return {"chat_first_text_s": first, "chat_total_s": chat_s, "batch_s": time.perf_counter() - t_batch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-tokens", type=int, default=400)
    ap.add_argument("--chat-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {"preempt": [], "wait": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name in runs:
                state = Path(tmp) / f"{name}-{len(runs[name])}"
                state.mkdir()
                srv = EieServer(config(name == "preempt", args.threads, state), state)
                try:
                    with httpx.Client(base_url=srv.base, timeout=300) as client:
                        runs[name].append(one_run(client, args.batch_tokens, args.chat_tokens))
                        runs[name][-1]["preemptions"] = sched(client)["background_preemptions"]
                finally:
                    srv.stop()
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in ("chat_first_text_s", "chat_total_s",
                                                                        "batch_s")}
               for name, rs in runs.items()}
    print(f"SmolLM2-135M Q4_1, one slot, {args.threads} threads; batch request {args.batch_tokens} tokens, "
          f"chat request {args.chat_tokens} tokens; medians of {args.repeats}")
    print(f"{'':10} {'chat first text':>16} {'chat total':>11} {'batch request':>14}")
    for name, m in medians.items():
        print(f"{name:10} {m['chat_first_text_s'] * 1000:13.0f} ms {m['chat_total_s'] * 1000:8.0f} ms "
              f"{m['batch_s']:12.2f} s")
    out = ROOT / "bench" / "results" / "batch_preemption.json"
    out.write_text(json.dumps({"args": vars(args), "medians": medians, "runs": runs}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
