"""Predicted outputs (`prediction` on chat) side by side: decode tok/s of the same greedy answer
without a prediction and with one, on one server per model with speculative decoding on (the
`ngram` source, as the default preset has it; a prediction needs a model that speculates).

Tasks:
  regenerate  a story asked again with the first answer as the prediction (a chat UI's
              "regenerate", an agent that replays a step): the text is nowhere in the prompt,
              so prompt lookup has little to draft from;
  edit        speculative.py's rewrite task (correct the spelling of a ~400-token text), with
              the misspelled text as the prediction (OpenAI's use case: the file being edited
              is the prediction). The text is in the prompt as well, so prompt lookup drafts
              most of it already: this row says what a prediction adds to that.
Each repeat runs without and with the prediction, alternating which goes first; decode tok/s is
(completion tokens − 1) / (time from the first to the last token). The answers must be identical
(greedy). llama-server has no predicted outputs; its plain decode against EIE's is in
serve_vs_llama_server.py and speculative.py.

    .venv/bin/python bench/predicted_outputs.py [--models smollm2-135m,gemma3-270m] [--repeats 5]
Prints a table and writes bench/results/predicted_outputs.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import speculative
from eie_server import EieServer
from speculative import GPL, MODELS, misspell, rewrite_prompt, story_prompt

ROOT = Path(__file__).resolve().parent.parent


class Server(EieServer):
    def __init__(self, model: str, state: Path, threads: int):
        # no prefix cache: each run prefills cold, as in speculative.py
        super().__init__({"server": {"state_dir": str(state), "cache_dir": str(state / "cache")},
                          "models": [{"name": "m", "path": str(ROOT / "models" / MODELS[model]), "n_ctx": 2048,
                                      "n_parallel": 4, "threads": threads, "speculative": {"sources": ["ngram"]},
                                      "kv_cache": {"prefix": {"enabled": False}}}]}, state)


def stream(base: str, prompt: str, max_tokens: int, prediction: str | None) -> dict:
    fields = {"prediction": {"type": "content", "content": prediction}} if prediction is not None else {}
    out = speculative.stream(base, prompt, max_tokens, True, **fields)
    first, last, tokens = out["first"], out["last"], out["tokens"]
    details = out["usage"].get("completion_tokens_details") or {}
    return {"tok_s": (tokens - 1) / (last - first) if first and last and last > first else 0.0, "tokens": tokens,
            "text": out["text"], "accepted": details.get("accepted_prediction_tokens", 0),
            "rejected": details.get("rejected_prediction_tokens", 0)}


def edit_text(k: int) -> str:
    start = 1200 + 1800 * k
    return misspell(" ".join(GPL[start : start + 1700].split()))


def task_runs(server: Server, task: str, k: int) -> tuple[str, int, str]:
    """(prompt, max tokens, prediction) of one repeat of a task."""
    if task == "edit":
        return rewrite_prompt(k), 480, edit_text(k)
    prompt = story_prompt(k)
    return prompt, 200, stream(server.base, prompt, 200, None)["text"]  # the first answer


def bench_model(model: str, args: argparse.Namespace, state: Path) -> list[dict]:
    server = Server(model, state, args.threads)
    rows = []
    try:
        stream(server.base, "Say hello.", 16, None)  # warm-up
        for task in args.tasks.split(","):
            plain, predicted, accepted, rejected, tokens = [], [], [], [], []
            same = True
            for rep in range(args.repeats):
                prompt, max_tokens, prediction = task_runs(server, task, rep)
                order = (None, prediction) if rep % 2 == 0 else (prediction, None)
                res = {p is not None: stream(server.base, prompt, max_tokens, p) for p in order}
                plain.append(res[False]["tok_s"])
                predicted.append(res[True]["tok_s"])
                accepted.append(res[True]["accepted"])
                rejected.append(res[True]["rejected"])
                tokens.append(res[True]["tokens"])
                same &= res[False]["text"] == res[True]["text"]
            row = {"model": model, "task": task, "plain_tok_s": round(statistics.median(plain), 1),
                   "predicted_tok_s": round(statistics.median(predicted), 1),
                   "speedup": round(statistics.median(p / q for p, q in zip(predicted, plain)), 2),
                   "accepted_share": round(sum(accepted) / sum(tokens), 3) if sum(tokens) else None,
                   "rejected_per_answer": round(statistics.mean(rejected), 1), "identical_outputs": same,
                   "repeats": args.repeats, "plain_runs": plain, "predicted_runs": predicted}
            rows.append(row)
            print(f"{model:13} {task:10} without {row['plain_tok_s']:6.1f}  with {row['predicted_tok_s']:6.1f}  "
                  f"x{row['speedup']:.2f}  accepted {row['accepted_share']}  same {same}", flush=True)
    finally:
        server.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tasks", default="regenerate,edit")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "predicted_outputs.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            rows += bench_model(model, args, Path(tmp))
    print("\n| model | task | decode tok/s without a prediction | with | speedup (median of ratios) | "
          "share of tokens from the prediction | identical |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['task']} | {r['plain_tok_s']} | {r['predicted_tok_s']} | {r['speedup']} | "
              f"{r['accepted_share']} | {r['identical_outputs']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "threads": args.threads,
                                    "sources": ["ngram"], "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
