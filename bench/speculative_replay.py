"""Offline replay of the speculative planner: where decode speed is lost on a task.

Gets SmolLM2's greedy answers to a bench/speculative.py task from a real server (speculation
off), then replays the real `Speculator` (ngram + history, history carried from answer to answer
as in the bench) over them, step by step: each step's drafts are checked against the known
answer, and its time is the measured decode cost of its rows (bench/results/q4_1_rows.json,
SmolLM2 with patch 0002's kernel, every width from 1 to 17 rows) plus the runner's own time per
step (STEP_OVERHEAD_MS, PROPOSE_MS, DRAFT_OVERHEAD_MS). SmolLM2
only: that table is measured for its Q4_1 file. Two plans side by side:
- `planned`: what the server does: the controller's plain and speculating steps, and in these
  the draft counts the planner chooses;
- `exact`: the same chosen drafts, each verified to exactly as many tokens as turn out right
  (the bound on what better acceptance estimates could give with these draft sources; no
  controller).
Speed-up = answer tokens × one-row step time / replayed time; also the mean over the answers
after the first (those with history to draft from).

    .venv/bin/python bench/speculative_replay.py [--task json] [--answers 12]
Prints a table and writes bench/results/speculative_replay.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import speculative as S

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The runner's time around a decode, medians from a temporary probe in the runner serving SmolLM2
# (2026-12-01; 1 ms had been assumed before): a plain one-row step 0.12 ms (sampling, the loop);
# a step where the speculative path runs, drafts or not, PROPOSE_MS more (lookups, scoring the
# watched drafts, the plan: 0.064 ms in stories, where nothing pays); each verified draft
# DRAFT_OVERHEAD_MS more (its row's sampling; a JSON step with 3.2 rows took 0.48 ms in all).
STEP_OVERHEAD_MS = 0.12
PROPOSE_MS = 0.06
DRAFT_OVERHEAD_MS = 0.14  # per verified draft
MODEL = "smollm2-135m"  # the model bench/q4_1_rows.py measures


COSTS = ROOT / "bench" / "results" / "q4_1_rows.json"


def row_costs(path: Path = COSTS, setting: str = "tiled") -> dict[int, float]:
    """ms by rows of one setting of a row_costs.py table (q4_1_rows.py's "tiled", amx_rows.py's
    "AMX + vnni rows" or "file layout"; amx_rows_0013.json: "AMX rows + vnni rows", ...)."""
    medians = json.loads(path.read_text())["median_ms"][setting]
    return {int(k): v for k, v in medians.items() if k.isdigit()}


def step_ms(table: dict[int, float], rows: int) -> float:
    """A step's time with `rows` rows: the decode interpolated in the measured table (linear past
    its end) and the runner's own time."""
    overhead = STEP_OVERHEAD_MS + DRAFT_OVERHEAD_MS * (rows - 1)
    ks = sorted(table)
    for lo, hi in zip(ks, ks[1:]):
        if lo <= rows <= hi:
            return table[lo] + (table[hi] - table[lo]) * (rows - lo) / (hi - lo) + overhead
    lo, hi = ks[-2], ks[-1]
    return table[hi] + (table[hi] - table[lo]) / (hi - lo) * (rows - hi) + overhead


def answers(model: str, task: str, n: int) -> list[str]:
    make, max_tokens = S.TASKS[task]
    with tempfile.TemporaryDirectory() as tmp:
        server = S.Server(model, Path(tmp), ["ngram"], 2)
        try:
            return [S.stream(server.base, make(k), max_tokens, False)["text"] for k in range(n)]
        finally:
            server.stop()


def replay(model: str, task: str, texts: list[str], exact: bool, costs: Path = COSTS,
           setting: str = "tiled") -> list[float]:
    import llama_cpp as lc

    from appliance.config import SpeculativeConfig
    from appliance.engine import native
    from appliance.engine.speculative.history import HistoryIndex
    from appliance.engine.speculative.speculator import Speculator

    native.init_backend()
    mp = lc.llama_model_default_params()
    mp.vocab_only = True
    vocab_model = lc.llama_model_load_from_file(str(ROOT / "models" / S.MODELS[model]).encode(), mp)
    vocab = lc.llama_model_get_vocab(vocab_model)

    def tokenize(text: str) -> list[int]:
        raw = text.encode()
        buf = (lc.llama_token * (len(raw) + 16))()
        return list(buf[: lc.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, True)])

    table = row_costs(costs, setting)
    spec = Speculator(SpeculativeConfig(sources=["ngram", "history"]), history=HistoryIndex(None))
    for _ in range(20):
        spec.cost.observe(1, step_ms(table, 1) / 1000)
    out = []
    make = S.TASKS[task][0]
    for k, text in enumerate(texts):
        prompt, answer = tokenize(make(k)), tokenize(text)
        st = spec.new_sequence(prompt)
        i, spent = 0, 0.0
        while i < len(answer):
            room = min(len(answer) - i - 1, spec.cfg.max_draft)
            proposed = True
            if exact:
                kind, drafts = chosen_lookup(spec, st, room)
            elif spec.controller.speculate(1):
                spec.propose([(0, st, room)], 1)
                drafts = st.pending
            else:  # the controller's plain step
                drafts = st.pending = []
                proposed = False
            right = 0
            while right < len(drafts) and drafts[right] == answer[i + right]:
                right += 1
            if exact and drafts:  # what propose's scoring of the lookup would have learnt
                for acc in (st.accept[kind], spec.accept[kind]):
                    acc.update(len(drafts) if right == len(drafts) else right + 1, right)
            verified = right if exact else len(drafts)
            ms = step_ms(table, 1 + verified) + (PROPOSE_MS if proposed else 0.0)
            spec.cost.observe(1 + verified, ms / 1000)
            if not exact:
                declined = (ms - PROPOSE_MS) / 1000 if proposed and not drafts else None  # as the runner
                spec.controller.record(1, proposed, ms / 1000, right + 1, declined)
                if drafts:
                    spec.lone_step(st, ms / 1000, right + 1)
                spec.verified(st, right)
            st.tokens += answer[i : i + right + 1]
            i += right + 1
            spent += ms
        spec.finished(0, st)
        out.append(len(answer) * step_ms(table, 1) / spent)
    lc.llama_model_free(vocab_model)
    return out


def chosen_lookup(spec, st, room: int) -> tuple[str, list[int]]:
    """The lookup draft (kind, tokens) the planner would take for this sequence, in full: the one
    with the most expected accepted tokens, as `Speculator.propose` chooses it."""
    best, best_gain = ("", []), -1.0
    for source in spec.sources:
        for kind, found in spec._lookups(source, st, room):
            gain = sum(spec.gains(st, kind, len(found)))
            if gain > best_gain:
                best, best_gain = (kind, list(found)), gain
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="json", choices=list(S.TASKS))
    ap.add_argument("--answers", type=int, default=12)
    ap.add_argument("--costs", type=Path, default=COSTS, help="decode cost by rows (bench/q4_1_rows.py's JSON)")
    ap.add_argument("--setting", default="tiled", help="the table's column (amx_rows.json: 'AMX + vnni rows')")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "speculative_replay.json")
    args = ap.parse_args()
    texts = answers(MODEL, args.task, args.answers)
    rows = {plan: replay(MODEL, args.task, texts, plan == "exact", args.costs, args.setting)
            for plan in ("planned", "exact")}
    print(f"\n| plan | {' | '.join(f'answer {k + 1}' for k in range(len(texts)))} | mean of 2.. |")
    print("|---|" + "---|" * (len(texts) + 1))
    for plan, speedups in rows.items():
        warm = statistics.mean(speedups[1:]) if len(speedups) > 1 else float("nan")
        print(f"| {plan} | {' | '.join(f'{x:.2f}×' for x in speedups)} | {warm:.2f}× |")
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "model": MODEL, "task": args.task,
                                    "costs": str(args.costs.resolve().relative_to(ROOT)) if args.costs.resolve().is_relative_to(ROOT) else str(args.costs),
                                    "setting": args.setting,
                                    "speedup_by_answer": {p: [round(x, 3) for x in v] for p, v in rows.items()}},
                                   indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
