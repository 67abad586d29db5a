"""Speculative decoding side by side: decode tok/s with and without it, on one server per model.

Tasks: (a) rewrite: correct the spelling of a ~400-token text (GPL v3 text from
/usr/share/common-licenses with a misspelled word in every five); (b) JSON extraction from a
~300-token document; (c) free-form story writing, a new story in every repeat and stream, 9
repeats by default (one 160-token story's speed moves by ±5 % between runs). Each repeat sends the same request with
`speculative: false` and with speculation (alternating which goes first), greedy, streamed;
decode tok/s is (completion tokens − 1) / (time from the first to the last token). With
`--streams 4` the four requests (different texts) run at once and the figure is the aggregate.
Acceptance and draft lengths come from the server's status (counters read before and after).
The outputs of both modes are compared too (greedy: they must be identical).

    .venv/bin/python bench/speculative.py [--models smollm2-135m,gemma3-270m] [--repeats 3] [--story-repeats 27]
        [--sources ngram] [--threads 2] [--tasks rewrite,json,story] [--streams 1,4]
Prints a table and writes bench/results/speculative.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from eie_server import EieServer

ROOT = Path(__file__).resolve().parent.parent
GPL = Path("/usr/share/common-licenses/GPL-3").read_text()
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}


def misspell(text: str) -> str:
    """Swap two inner letters of every fifth word longer than four letters (deterministic)."""
    words = text.split(" ")
    n = 0
    for i, w in enumerate(words):
        if len(w) > 4 and w.isalpha():
            n += 1
            if n % 5 == 0:
                words[i] = w[0] + w[2] + w[1] + w[3:]
    return " ".join(words)


def rewrite_prompt(k: int) -> str:
    start = 1200 + 1800 * k
    text = " ".join(GPL[start : start + 1700].split())
    return ("Correct the spelling mistakes in the following text. Write out the whole corrected text and "
            f"nothing else.\n\n{misspell(text)}")


PEOPLE = [("Maria Lindqvist", "Harbor Supplies Ltd", "Gothenburg"), ("Tomas Okafor", "Delta Freight GmbH", "Bremen"),
          ("Aiko Tanaka", "Blue Reef Tools", "Osaka"), ("Pedro Alvarez", "Sierra Parts SA", "Valencia")]


def json_prompt(k: int) -> str:
    name, company, city = PEOPLE[k % len(PEOPLE)]
    doc = (f"From: {name} <{name.split()[0].lower()}@{company.split()[0].lower()}.example>\n"
           f"Subject: Order confirmation 44{k}7\n\n"
           f"Dear team,\n\nthank you for your order placed on 12 March 2024. {company}, based in {city}, confirms "
           f"the delivery of 24 units of the stainless steel valve (item VX-210) at 18.50 EUR each and 6 units of "
           f"the pressure gauge (item PG-7) at 42.00 EUR each. Shipping is by road freight and should arrive within "
           f"ten working days at your warehouse on 5 Canal Street. The invoice number is INV-2024-0{k}31, payment is "
           f"due within 30 days, and the total amount including shipping is 720.00 EUR. If you have any questions "
           f"about this order, please contact {name} directly by email or call +46 31 555 01{k}2.\n\n"
           f"Kind regards,\n{name}\n{company}")
    return ("Extract the following fields from the document as a JSON object: sender_name, sender_email, company, "
            "city, order_date, invoice_number, items (a list of objects with item_code, description, quantity, "
            "unit_price), total_amount, currency, phone. Answer with the JSON only.\n\n" + doc)


STORIES = ["a lighthouse keeper who finds a message in a bottle", "a fox who learns to play the violin",
           "two children who build a boat from old doors", "a robot gardener on a space station"]
# Stories beyond the four above: every request a story of its own (one told before would be copied
# from the history), enough for --story-repeats × 4 streams.
CHARACTERS = ["an old clockmaker", "a shy dragon", "a retired pirate", "a curious mouse", "a girl who talks to the wind",
              "a postman on the moon", "a baker who cannot sleep", "a lost robot dog", "a young witch with no magic",
              "a grandmother who builds kites", "a cat who runs a hotel", "a boy who collects echoes"]
PLACES = ["in a village where it never stops snowing", "in a library that rearranges itself at night",
          "on a ship made of glass", "in a city under the sea", "at a circus in the desert", "in a forest of paper trees",
          "on a train that never stops", "on an island that moves", "in a castle made of clouds",
          "in a market that opens at midnight", "at the bottom of an old well"]
STORIES += [f"{c} {p}" for p in PLACES for c in CHARACTERS]  # 136: enough for 27 + 27 × 4


def story_prompt(k: int) -> str:
    return f"Write an imaginative short story about {STORIES[k % len(STORIES)]}."


TASKS = {"rewrite": (rewrite_prompt, 480), "json": (json_prompt, 200), "story": (story_prompt, 160)}


class Server(EieServer):
    def __init__(self, model: str, state: Path, sources: list[str], threads: int):
        # No prefix cache: a restored prefix was prefilled in other chunks, so its KV (and a greedy
        # answer) can differ in the last bits from a cold prefill, which would hide what
        # speculation itself changes. The cache directory is the run's own (the history source).
        super().__init__({"server": {"state_dir": str(state), "cache_dir": str(state / "cache")},
                          "models": [{"name": "m", "path": str(ROOT / "models" / MODELS[model]), "n_ctx": 2048,
                                      "n_parallel": 4, "threads": threads, "speculative": {"sources": sources},
                                      "kv_cache": {"prefix": {"enabled": False}}}]}, state)

    def spec(self) -> dict:
        return httpx.get(self.base + "/v1/admin/scheduling/status").json()["models"]["m"]["speculative"]


def stream(base: str, prompt: str, max_tokens: int, speculative: bool, **fields) -> dict:
    """A greedy streamed chat answer (`fields`: more of the request): the times of its first and
    last text, its completion tokens, its text and its usage."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "speculative": speculative,
            **fields}
    first = last = None
    parts: list[str] = []
    tokens = 0
    usage: dict = {}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
                tokens = usage["completion_tokens"]
            for c in chunk.get("choices", []):
                if c["delta"].get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    parts.append(c["delta"]["content"])
    return {"first": first, "last": last, "tokens": tokens, "text": "".join(parts), "usage": usage}


def run_mode(server: Server, task: str, first: int, streams: int, speculative: bool) -> dict:
    make, max_tokens = TASKS[task]
    prompts = [make(first + i) for i in range(streams)]
    before = server.spec()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        outs = list(pool.map(lambda p: stream(server.base, p, max_tokens, speculative), prompts))
    after = server.spec()
    tokens = sum(o["tokens"] for o in outs)
    span = max(o["last"] for o in outs) - min(o["first"] for o in outs)
    drafted = after["drafted"] - before["drafted"]
    accepted = after["accepted"] - before["accepted"]
    return {"tok_s": (tokens - streams) / span if span > 0 else 0.0, "tokens": tokens, "drafted": drafted,
            "accepted": accepted, "texts": [o["text"] for o in outs],
            "median_draft_length": after["median_draft_length"], "controller_on": after["controller_on"]}


def bench_model(model: str, args, state: Path) -> list[dict]:
    server = Server(model, state, args.sources.split(","), args.threads)
    rows = []
    stories = 0  # stories told so far: each request gets one of its own
    try:
        stream(server.base, "Say hello.", 16, True)  # warm-up (no task's text: the history must not hold one)
        for task in args.tasks.split(","):
            for streams in map(int, args.streams.split(",")):
                plain, spec, same = [], [], True
                drafted = accepted = 0
                lengths = []
                for rep in range(args.story_repeats if task == "story" else args.repeats):
                    order = (False, True) if rep % 2 == 0 else (True, False)
                    first = stories if task == "story" else rep * streams
                    res = {m: run_mode(server, task, first, streams, m) for m in order}
                    if task == "story":
                        stories += streams
                    plain.append(res[False]["tok_s"])
                    spec.append(res[True]["tok_s"])
                    drafted += res[True]["drafted"]
                    accepted += res[True]["accepted"]
                    lengths.append(res[True]["median_draft_length"])
                    same &= res[False]["texts"] == res[True]["texts"]
                # each repeat's two runs decode the same answer: the speed-up is the median of the
                # repeats' ratios (a ratio of medians would compare different texts' speeds)
                row = {"model": model, "task": task, "streams": streams,
                       "plain_tok_s": round(statistics.median(plain), 1), "spec_tok_s": round(statistics.median(spec), 1),
                       "speedup": round(statistics.median(s / p for s, p in zip(spec, plain)), 2),
                       "ratio_of_medians": round(statistics.median(spec) / statistics.median(plain), 2),
                       "acceptance": round(accepted / drafted, 3) if drafted else None,
                       "drafted_per_run": drafted // len(spec), "repeats": len(spec),
                       "median_draft_length": statistics.median(x for x in lengths if x is not None) if any(lengths) else None,
                       "identical_outputs": same, "plain_runs": plain, "spec_runs": spec}
                rows.append(row)
                print(f"{model:13} {task:8} {streams} streams  plain {row['plain_tok_s']:6.1f}  spec "
                      f"{row['spec_tok_s']:6.1f}  x{row['speedup']:.2f}  accept {row['acceptance']}  "
                      f"draft len {row['median_draft_length']}  same {same}", flush=True)
        status = server.spec()
        rows.append({"model": model, "controller": status["controller"],
                     "exact_verify_rows": status["exact_verify_rows"], "step_ms_by_rows": status["step_ms_by_rows"],
                     "step_ms_by_sequences": status["step_ms_by_sequences"]})
    finally:
        server.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--story-repeats", type=int, default=27,
                    help="story repeats (a new story each; one 160-token story's speed-up moves by ±10 %%, so a "
                         "median of 9 moved by about ±4 %%)")
    ap.add_argument("--sources", default="ngram,history")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--streams", default="1,4", help="concurrent streams to measure, e.g. 1,4")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "speculative.json")
    args = ap.parse_args()
    t0 = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            rows += bench_model(model, args, Path(tmp))
    table = [r for r in rows if "task" in r]
    print("\n| model | task | streams | decode tok/s without | with | speedup | acceptance | median draft length | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['model']} | {r['task']} | {r['streams']} | {r['plain_tok_s']} | {r['spec_tok_s']} | "
              f"{r['speedup']} | {r['acceptance']} | {r['median_draft_length']} | {r['identical_outputs']} |")
    out = args.out
    runs = json.loads(out.read_text()).get("runs", {}) if out.is_file() else {}
    for model in args.models.split(","):  # one entry per model: running one model keeps the other's
        runs[model] = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": args.repeats,
                       "story_repeats": args.story_repeats, "sources": args.sources,
                       "threads": args.threads, "rows": [r for r in rows if r["model"] == model]}
    out.write_text(json.dumps({"runs": runs}, indent=1))
    print(f"wrote {out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
