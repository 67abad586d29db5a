#!/usr/bin/env python3
"""Reading streamed tool calls: CPU time to read a long call (a file written through a tool)
as it streams, every piece re-read against re-reading only as the call grows, side by side.

An answer reader (api/native_answers.py, api/tools.py) reads a call's whole text each time it
reads it. Streamed 4 characters at a time (about a token), re-reading it on every piece costs the
square of its length; api/call_stream.CallReader re-reads a call past EAGER_CHARS only once it has
grown by a READ_SHARE-th of itself (or READ_WAIT_NS have passed). A direct answer in EIE's format
({"response": "..."}) is decoded from where the last piece left it. This bench streams the same
answers through both ways in one run (the old way: EAGER_CHARS set beyond any call) and times
each with time.process_time, the median of --repeats runs; the deltas of both add up to the same
arguments (checked).

  format      hermes, qwen3-coder (a string parameter as raw text), eie (EIE's JSON format)
  kb          the call's size
  every_s     CPU seconds, every piece re-read
  growing_s   CPU seconds, re-read as it grows
  deltas      the argument pieces that went out (every piece / as it grows)

Run: .venv/bin/python bench/call_reading.py [--repeats 3]
Prints a table and writes bench/results/call_reading.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from appliance.api import call_stream, native_answers, tools  # noqa: E402
from appliance.api.native_tools import NativeFormat  # noqa: E402

WRITE = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "text": {"type": "string"}}}}}]
LINE = 'def double(x):\n    return x * 2  # "twice"\n'
FORMATS = {"hermes": NativeFormat("hermes", 7), "qwen3-coder": NativeFormat("qwen3-coder", 7), "eie": None}


def answer(fmt: str, body: str) -> str:
    call = {"name": "write", "arguments": {"path": "a.py", "text": body}}
    if fmt == "hermes":
        return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
    if fmt == "qwen3-coder":
        return (f"<tool_call>\n<function=write>\n<parameter=path>\na.py\n</parameter>\n<parameter=text>\n{body}\n"
                "</parameter>\n</function>\n</tool_call>")
    return json.dumps({"tool_calls": [call]})


def read_streamed(fmt: str, text: str) -> tuple[float, int, str]:
    """CPU seconds to stream `text` through its reader 4 characters at a time, the deltas, and
    the arguments they add up to."""
    native = FORMATS[fmt]
    reader = native_answers.AnswerReader(native, WRITE, True) if native else tools.AnswerReader(True)
    deltas = []
    t = time.process_time()
    for i in range(0, len(text), 4):
        reader.push(text[i:i + 4])
        deltas += reader.take_calls()
    reader.finish("stop")
    deltas += reader.take_calls()
    return time.process_time() - t, len(deltas), "".join(d.arguments for d in deltas)


def timed(fmt: str, text: str, every_piece: bool, repeats: int) -> tuple[float, int, str]:
    eager = call_stream.EAGER_CHARS
    call_stream.EAGER_CHARS = 1 << 40 if every_piece else eager
    try:
        runs = [read_streamed(fmt, text) for _ in range(repeats)]
    finally:
        call_stream.EAGER_CHARS = eager
    return statistics.median(r[0] for r in runs), runs[0][1], runs[0][2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="10,40,100", help="call sizes in KB")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "call_reading.json")
    a = ap.parse_args()
    rows = []
    print(f"{'format':12} {'kb':>4} {'every_s':>8} {'growing_s':>9} {'deltas':>13}")
    for kb in (int(k) for k in a.sizes.split(",")):
        body = (LINE * (kb * 1024 // len(LINE) + 1))[:kb * 1024]
        for fmt in FORMATS:
            text = answer(fmt, body)
            every, every_deltas, every_args = timed(fmt, text, True, a.repeats)
            growing, growing_deltas, growing_args = timed(fmt, text, False, a.repeats)
            assert every_args == growing_args == json.dumps({"path": "a.py", "text": body}), fmt
            rows.append({"format": fmt, "kb": kb, "every_s": round(every, 3), "growing_s": round(growing, 3),
                         "every_deltas": every_deltas, "growing_deltas": growing_deltas})
            print(f"{fmt:12} {kb:>4} {every:>8.2f} {growing:>9.2f} {every_deltas:>6}/{growing_deltas:<6}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": a.repeats,
                                 "piece_chars": 4, "eager_chars": call_stream.EAGER_CHARS,
                                 "read_share": call_stream.READ_SHARE, "results": rows}, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
