#!/usr/bin/env python3
"""Benchmark: EIE against llama-server built from the llama.cpp that llama-cpp-python vendors.

Both servers get the same model file, threads, slot count, context, batch sizes, KV layout
(unified, f16, full-size SWA) and flash-attention setting. For each model it measures, as the
median of `--repeats` runs, alternating which server goes first from one repeat to the next:

  decode      single-stream decode tok/s = (completion_tokens - 1) / (t_last_token - t_first_token)
  ttft_512    time to first token of a ~512-token prompt (streaming, max_tokens=1)
  agg4        aggregate tok/s of 4 concurrent streams = sum(completion_tokens) / wall time

Every request carries a prompt not sent before (prompt caching cannot help either server) and
`"cache_prompt": false` (EIE ignores the unknown field). Ratios are eie/llama-server for the
rates and llama/eie for TTFT, so >= 1.0 always means EIE is as good or better; the goal is 0.95.

Both servers stay up side by side (each burns ~0 CPU when idle, checked at start; otherwise
they run one at a time, see --mode). On a 2-core machine any other busy process wrecks spinning
ggml threads, so before each measurement the script waits until the machine is quiet, and a
measurement during which other processes used more than --noise-limit cores is retried and, if
it stays noisy, flagged in the table's footer and the JSON.

llama-server without --cache-ram never clears idle slots, so with a unified KV cache later
requests would attend over other slots' stale cells (slower), while EIE frees a sequence's KV when
it ends. So that both start each measurement from an empty KV cache, the script erases every
llama-server slot (POST /slots/N?action=erase, outside the timed window); --keep-stale-kv skips that.
EIE runs with its prefix cache on, as shipped, but each measurement is a cold one: its saved
prefixes are flushed before each measurement (POST /v1/admin/kv/flush, outside the timed window;
a retried measurement would otherwise hit the first attempt's entry) and its disk tier lives in
the run's own directory (an earlier run's entries would answer the same prompts).

Run: .venv/bin/python bench/serve_vs_llama_server.py [--model smollm2-135m|gemma3-270m|all]
The first run builds llama-server (minutes on 2 cores) and caches the binary under
${XDG_CACHE_HOME:-~/.cache}/eie/llama-server/<key>/. Writes bench/results/serve_vs_llama_server.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = REPO / "models"
DEFAULT_OUT = REPO / "bench" / "results" / "serve_vs_llama_server.json"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# GGML_NATIVE=ON and OpenMP (ggml's default) match how native/build-llama-wheel.sh builds the
# wheel EIE runs on: llama-cpp-python's default CMake flags, Release build type.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DBUILD_SHARED_LIBS=OFF",
)
GOAL = 0.95
HOST = "127.0.0.1"
TTFT_PROMPT_TOKENS = 512
CONCURRENT_STREAMS = 4
# Per-process CPU (in cores) below which an idle server counts as truly idle.
IDLE_CPU_LIMIT = 0.02
HTTP_TIMEOUT = httpx.Timeout(300.0, connect=10.0)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    file: str
    n_ctx: int = 2048  # per sequence, as in EIE's config
    n_parallel: int = 4
    n_batch: int = 512
    threads: int = 2


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ModelSpec("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
}


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---- building llama-server ---------------------------------------------------------------------


def source_inputs() -> list[Path]:
    """What native/prepare-llama-source.sh puts into the llama.cpp tree: part of the cache key."""
    native = REPO / "native"
    return [native / "prepare-llama-source.sh", *sorted((native / "patches").glob("*.patch")),
            *sorted((native / "turboquant").glob("*.[ch]"))]


def llama_server_key() -> str:
    h = hashlib.sha256()
    h.update(f"{LLAMA_CPP_PYTHON_VERSION}|{' '.join(CMAKE_FLAGS)}|{platform.machine()}".encode())
    for p in source_inputs():
        h.update(b"|" + p.name.encode() + b"|" + p.read_bytes())
    return h.hexdigest()[:16]


def llama_server_cache_path() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "eie" / "llama-server" / llama_server_key() / "llama-server"


def download_sdist(dest: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         "-d", str(dest), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"],
        check=True,
    )
    sdists = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise RuntimeError(f"pip download left no sdist in {dest}")
    return sdists[0]


def build_llama_server(jobs: int) -> Path:
    """Build llama-server once per (version, flags, patches) and cache the binary."""
    target = llama_server_cache_path()
    if target.is_file() and os.access(target, os.X_OK):
        log(f"cached llama-server: {target}")
        return target
    with tempfile.TemporaryDirectory(prefix="eie-llama-server-") as tmp:
        work = Path(tmp)
        sdist = download_sdist(work / "sdist")
        with tarfile.open(sdist) as tf:
            tf.extractall(work, filter="data")
        src = next(work.glob("llama_cpp_python-*/")) / "vendor" / "llama.cpp"
        subprocess.run([str(REPO / "native" / "prepare-llama-source.sh"), str(src)], check=True)
        build = work / "build"
        log(f"building llama-server {LLAMA_CPP_PYTHON_VERSION} ({' '.join(CMAKE_FLAGS)}), {jobs} jobs; takes minutes")
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
                       check=True, stdout=subprocess.DEVNULL)
        built = build / "bin" / "llama-server"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp_target = target.with_suffix(".tmp")
        shutil.copy2(built, tmp_target)
        tmp_target.replace(target)
    log(f"built llama-server: {target}")
    return target


def llama_server_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    return " ".join((out.stdout + out.stderr).split())


# ---- CPU accounting ----------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def system_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = vals[3] + vals[4]
    return (sum(vals) - idle) / CLK_TCK


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class CpuWindow:
    """CPU use over one measurement: the server, this client, and everything else (noise)."""

    server_pid: int
    wall: float = 0.0
    server_cores: float = 0.0
    client_cores: float = 0.0
    other_cores: float = 0.0

    @contextlib.contextmanager
    def measure(self) -> Iterator["CpuWindow"]:
        t0, s0, c0, b0 = time.perf_counter(), proc_cpu_seconds(self.server_pid), self_cpu_seconds(), system_busy_seconds()
        yield self
        t1, s1, c1, b1 = time.perf_counter(), proc_cpu_seconds(self.server_pid), self_cpu_seconds(), system_busy_seconds()
        self.wall = t1 - t0
        if self.wall > 0:
            self.server_cores = (s1 - s0) / self.wall
            self.client_cores = (c1 - c0) / self.wall
            self.other_cores = max(0.0, (b1 - b0) - (s1 - s0) - (c1 - c0)) / self.wall


async def other_cpu_cores(exclude_pids: list[int], window_s: float) -> float:
    """Cores used over `window_s` by everything except `exclude_pids` and this process."""
    b0, c0 = system_busy_seconds(), self_cpu_seconds()
    p0 = sum(proc_cpu_seconds(p) for p in exclude_pids)
    await asyncio.sleep(window_s)
    b1, c1 = system_busy_seconds(), self_cpu_seconds()
    p1 = sum(proc_cpu_seconds(p) for p in exclude_pids)
    return max(0.0, (b1 - b0) - (p1 - p0) - (c1 - c0)) / window_s


async def wait_for_quiet(exclude_pids: list[int], limit_cores: float, max_wait_s: float) -> float:
    """Wait (bounded) until other processes use under `limit_cores` for two windows in a row.

    On a 2-core machine one busy foreign process makes spinning ggml threads collapse, so a
    measurement taken next to it says nothing about either server. Returns seconds waited.
    """
    window = 0.5
    t0 = time.monotonic()
    quiet = 0
    logged = False
    for _ in range(int(max_wait_s / window) + 2):
        busy = await other_cpu_cores(exclude_pids, window)
        quiet = quiet + 1 if busy < limit_cores else 0
        if quiet >= 2:
            break
        if time.monotonic() - t0 > max_wait_s:
            log(f"  machine still busy ({busy:.2f} cores used by other processes) after {max_wait_s:.0f}s; measuring anyway")
            break
        if not logged and quiet == 0:
            log(f"  waiting for other processes to go quiet ({busy:.2f} cores busy)")
            logged = True
    return time.monotonic() - t0


# ---- servers -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """preexec_fn: the server gets SIGTERM if this script dies without cleaning up."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    erase_slots: int = 0  # llama-server: slots to erase before each measurement
    flush_prefixes: bool = False  # EIE: flush the prefix cache before each measurement
    proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, ready_timeout_s: float = 180.0) -> None:
        log(f"starting {self.name}: {' '.join(self.argv)}")
        logf = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True, preexec_fn=_die_with_parent,
            )
        finally:
            logf.close()
        self._wait_ready(ready_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / 0.2) + 1):
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited during startup; see {self.log_path}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/health", timeout=2.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not healthy after {timeout_s:.0f}s; see {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        log(f"stopping {self.name} (pid {proc.pid})")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc.pid


def eie_config_yaml(spec: ModelSpec, port: int, cache_dir: Path) -> str:
    return (
        f"server: {{host: {HOST}, port: {port}, cache_dir: {json.dumps(str(cache_dir))}}}\n"
        f"model_dir: {json.dumps(str(MODEL_DIR))}\n"
        "models:\n"
        f"  - {{name: {spec.name}, path: {json.dumps(spec.file)}, n_ctx: {spec.n_ctx}, "
        f"n_parallel: {spec.n_parallel}, n_batch: {spec.n_batch}, threads: {spec.threads}, "
        "flash_attn: auto, kv_cache: {mode: f16}}\n"
    )


def llama_server_flags(spec: ModelSpec, slot_dir: Path) -> list[str]:
    """llama-server flags that mirror EIE's context: unified f16 KV of n_ctx*n_parallel cells,
    full-size SWA cache, n_batch = n_ubatch, flash-attn auto, and no prompt cache of any kind.
    --slot-save-path only enables POST /slots actions (erase); nothing is saved there."""
    return [
        "-m", str(MODEL_DIR / spec.file),
        "-c", str(spec.n_ctx * spec.n_parallel),
        "-np", str(spec.n_parallel),
        "--kv-unified",
        "--swa-full",
        "-t", str(spec.threads),
        "-tb", str(spec.threads),
        "-b", str(spec.n_batch),
        "-ub", str(spec.n_batch),
        "-fa", "auto",
        "-ctk", "f16",
        "-ctv", "f16",
        "--no-cache-prompt",
        "--cache-reuse", "0",
        "--cache-ram", "0",
        "--ctx-checkpoints", "0",
        "--no-context-shift",
        "--no-webui",
        "--slot-save-path", str(slot_dir),
    ]


def bench_arguments(description: str, out_name: str) -> argparse.ArgumentParser:
    """The options every side-by-side bench takes: --model, --repeats, --out (bench/results/<out_name>)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="all", choices=[*MODELS, "all"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / out_name)
    return p


def run_per_model(bench_model: Callable[..., Any], args: argparse.Namespace, prefix: str) -> list[dict]:
    """`await bench_model(name, llama_server_binary, workdir, args)` for the chosen models, in one
    temporary directory, llama-server built (or taken from the cache) first."""
    binary = build_llama_server(2)
    names = list(MODELS) if args.model == "all" else [args.model]
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return [asyncio.run(bench_model(n, binary, Path(tmp), args)) for n in names]


def save_results(out: Path, repeats: int, results: list[dict], **fields: Any) -> None:
    """A side-by-side bench's JSON: the date, repeats, its own fields and the per-model results."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": repeats, **fields,
                               "results": results}, indent=1))
    print(f"wrote {out}")


def make_servers(spec: ModelSpec, binary: Path, workdir: Path, erase_slots: bool = True) -> tuple[Server, Server]:
    eie_port, llama_port = free_port(), free_port()
    cfg = workdir / f"eie-{spec.name}.yaml"
    cfg.write_text(eie_config_yaml(spec, eie_port, workdir / f"eie-cache-{spec.name}"))
    eie = Server(
        "eie",
        [str(REPO / ".venv" / "bin" / "eie"), "serve", "--config", str(cfg), "--port", str(eie_port),
         "--log-level", "warning"],
        eie_port, workdir / f"eie-{spec.name}.log", flush_prefixes=True,
    )
    slot_dir = workdir / f"slots-{spec.name}"
    slot_dir.mkdir(exist_ok=True)
    llama = Server(
        "llama-server",
        [str(binary), *llama_server_flags(spec, slot_dir), "--host", HOST, "--port", str(llama_port)],
        llama_port, workdir / f"llama-server-{spec.name}.log",
        erase_slots=spec.n_parallel if erase_slots else 0,
    )
    return eie, llama


# ---- prompts -----------------------------------------------------------------------------------

CORPUS = """\
The lighthouse at the end of the northern pier was built in the spring of 1887, after two
fishing boats were lost on the rocks during a single winter storm. The town council argued for
months about the cost, and in the end the money came from a tax on every barrel of herring that
passed through the harbour. The first keeper was a retired sailor named Thomas Reed, who kept a
careful diary of the weather, the ships that passed, and the small repairs he made to the lamp.
His diary survives in the county archive, and it tells us a great deal about daily life on the
coast at the end of the nineteenth century. Reed rose before dawn to trim the wicks and polish
the brass, and he walked the length of the pier twice a day to check the mooring rings. In the
evenings he wrote letters to his sister in the city, describing the seabirds and the changing
colour of the water. When the harbour froze in the hard winter of 1895, he carried coal across
the ice on a wooden sledge, because the supply boat could not reach the pier for three weeks.
The town grew slowly around the harbour. A school opened in 1902, followed by a small library
and a market hall where farmers from the valley sold cheese, eggs and wool every Saturday. The
railway arrived in 1911 and changed everything. Visitors came from the industrial cities to walk
along the beach, and several large hotels were built on the cliff above the old fishing quarter.
The fishermen complained that the visitors got in the way of their work, but the hotels paid
well for fresh fish, and many families found that they could earn more in one summer than in a
whole year of winter fishing. During the war the lighthouse was painted grey so that it could not
be seen from the sea, and the lamp was lit only when a convoy was expected. After the war the
harbour declined as larger boats moved to the deep water ports further south. The hotels closed
one by one, and some of them were turned into flats or care homes for the elderly. In recent
years the town has found a new purpose. Artists have moved into the empty warehouses along the
quay, and a small festival of music and film now fills the streets every August. The lighthouse
itself was automated in 1978, and the keeper's cottage became a museum where children can climb
the spiral stairs and look out over the bay. On a clear day you can see the islands thirty miles
away, and in the autumn the seals come close to the rocks below the tower to rest and raise their
young. Local volunteers count them every year and send the numbers to a university research
group that studies how the population changes with the temperature of the sea. The museum also
keeps a collection of old charts, brass instruments and photographs donated by the families of
former keepers, and a small room is set aside for Reed's diary, which is read aloud to visitors
on the anniversary of the lamp's first lighting each spring. Teachers bring their classes to
the museum to learn about tides, navigation and the history of the coast, and many of the
children write their own short diaries after the visit, describing what they saw from the top
of the tower and what they imagine life was like for the keepers who lived there long ago.
"""

ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
    "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
    "eighteenth", "nineteenth", "twentieth",
)


def corpus_sentences() -> list[str]:
    text = " ".join(CORPUS.split())
    return [s.strip() + "." for s in text.split(". ") if s.strip()]


def long_text(variant: int) -> list[str]:
    """Words of an English passage that differs from its first word on for each variant."""
    sents = corpus_sentences()
    start = (variant * 7) % len(sents)
    rotated = sents[start:] + sents[:start]
    head = f"Chapter {variant + 1}, the {ORDINALS[variant % len(ORDINALS)]} part of the story."
    return (head + " " + " ".join(rotated + rotated)).split()


Tokenizer = Callable[[str], int]


def fit_prompt(words: list[str], n_tokens: int, count_tokens: Tokenizer) -> tuple[str, int]:
    """The longest prefix of `words` with at most n_tokens tokens (binary search, bounded)."""
    lo, hi = 1, len(words)
    if count_tokens(" ".join(words)) < n_tokens:
        raise RuntimeError("the corpus is too short for the requested prompt length")
    for _ in range(64):
        if lo >= hi:
            break
        mid = (lo + hi + 1) // 2
        if count_tokens(" ".join(words[:mid])) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    return text, count_tokens(text)


def llama_tokenizer(server: Server) -> Tokenizer:
    """Token count (with BOS, as both servers tokenize completion prompts) via llama-server."""

    def count(text: str) -> int:
        r = httpx.post(f"{server.base}/tokenize", json={"content": text, "add_special": True}, timeout=30.0)
        r.raise_for_status()
        return len(r.json()["tokens"])

    return count


def decode_prompt(variant: int) -> str:
    """A prompt small models continue for a long time under greedy decoding: counting."""
    start = 101 + 37 * variant
    return "Counting: " + ", ".join(str(n) for n in range(start, start + 12)) + ","


# ---- streaming client --------------------------------------------------------------------------


@dataclass
class StreamResult:
    t_start: float
    t_first: float | None = None  # first text (or finish) chunk
    t_last: float | None = None  # last text chunk
    t_end: float = 0.0
    text_chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    server_timings: dict[str, Any] | None = None  # llama-server's own `timings` (prompt_ms, predicted_ms, ...)

    @property
    def ttft(self) -> float:
        if self.t_first is None:
            raise RuntimeError("stream produced no chunk")
        return self.t_first - self.t_start

    @property
    def decode_rate(self) -> float:
        n = self.completion_tokens or 0
        if n < 2 or self.t_first is None or self.t_last is None or self.t_last <= self.t_first:
            raise RuntimeError(f"too few tokens to measure decode ({n})")
        return (n - 1) / (self.t_last - self.t_first)


def _absorb(res: StreamResult, obj: dict[str, Any], now: float) -> None:
    if "error" in obj:
        raise RuntimeError(f"server error in stream: {obj['error']}")
    for choice in obj.get("choices") or []:
        if choice.get("text"):
            res.text_chunks += 1
            res.t_last = now
            if res.t_first is None:
                res.t_first = now
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]
            if res.t_first is None:
                res.t_first = now
    usage = obj.get("usage")
    if usage:
        res.completion_tokens = usage.get("completion_tokens")
        res.prompt_tokens = usage.get("prompt_tokens")
    timings = obj.get("timings")  # llama-server's own counts, when usage is absent
    if timings:
        res.server_timings = timings
    if timings and res.completion_tokens is None:
        res.completion_tokens = timings.get("predicted_n")
        res.prompt_tokens = (timings.get("prompt_n") or 0) + (timings.get("cache_n") or 0)


async def stream_completion(client: httpx.AsyncClient, server: Server, model: str, prompt: str,
                            max_tokens: int) -> StreamResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_prompt": False,  # llama-server only; EIE ignores unknown fields
    }
    res = StreamResult(t_start=time.perf_counter())
    async with client.stream("POST", f"{server.base}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{server.name} answered {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:].strip()
            if data == "[DONE]":
                break
            _absorb(res, json.loads(data), time.perf_counter())
    res.t_end = time.perf_counter()
    if res.completion_tokens is None:
        raise RuntimeError(f"{server.name} reported no usage for a streamed completion")
    return res


# ---- figures -----------------------------------------------------------------------------------


@dataclass
class Sample:
    value: float
    detail: dict[str, Any]
    cpu: dict[str, float]
    attempts: int = 1
    noisy: bool = False


async def measure_decode(client: httpx.AsyncClient, server: Server, model: str, variant: int,
                         max_tokens: int) -> Sample:
    cpu = CpuWindow(server.pid)
    with cpu.measure():
        res = await stream_completion(client, server, model, decode_prompt(variant), max_tokens)
    return Sample(res.decode_rate, {"completion_tokens": res.completion_tokens, "text_chunks": res.text_chunks,
                                    "finish_reason": res.finish_reason, **_timings(res)}, _cpu(cpu))


async def measure_ttft(client: httpx.AsyncClient, server: Server, model: str, prompt: str) -> Sample:
    cpu = CpuWindow(server.pid)
    with cpu.measure():
        res = await stream_completion(client, server, model, prompt, 1)
    return Sample(res.ttft, {"prompt_tokens": res.prompt_tokens, **_timings(res)}, _cpu(cpu))


async def measure_aggregate(client: httpx.AsyncClient, server: Server, model: str, variant: int,
                            max_tokens: int) -> Sample:
    prompts = [decode_prompt(1000 + variant * CONCURRENT_STREAMS + i) for i in range(CONCURRENT_STREAMS)]
    cpu = CpuWindow(server.pid)
    with cpu.measure():
        t0 = time.perf_counter()
        results = await asyncio.gather(*(stream_completion(client, server, model, p, max_tokens) for p in prompts))
        wall = time.perf_counter() - t0
    tokens = sum(r.completion_tokens or 0 for r in results)
    return Sample(tokens / wall, {"completion_tokens": [r.completion_tokens for r in results], "wall_s": wall},
                  _cpu(cpu))


def _timings(res: StreamResult) -> dict[str, Any]:
    """llama-server's self-reported prompt/decode times, to tell compute from serving overhead."""
    t = res.server_timings
    if not t:
        return {}
    keys = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second")
    return {"server_timings": {k: t[k] for k in keys if k in t}}


def _cpu(w: CpuWindow) -> dict[str, float]:
    return {"server_cores": round(w.server_cores, 3), "client_cores": round(w.client_cores, 3),
            "other_cores": round(w.other_cores, 3)}


async def warm_up(client: httpx.AsyncClient, server: Server, model: str, warm_prompt: str) -> None:
    await stream_completion(client, server, model, decode_prompt(9999), 16)
    await stream_completion(client, server, model, warm_prompt, 1)
    await asyncio.gather(*(stream_completion(client, server, model, decode_prompt(8000 + i), 8)
                           for i in range(CONCURRENT_STREAMS)))


def idle_cpu(servers: list[Server], seconds: float = 3.0) -> dict[str, float]:
    """CPU cores each (idle) server burns over `seconds`."""
    before = {s.name: proc_cpu_seconds(s.pid) for s in servers}
    time.sleep(seconds)
    return {s.name: round((proc_cpu_seconds(s.pid) - before[s.name]) / seconds, 4) for s in servers}


# ---- one model ---------------------------------------------------------------------------------

FIGURES = ("decode_tok_s", "ttft_512_s", "agg4_tok_s")


@dataclass
class ModelRun:
    model: str
    mode: str = ""
    idle_cpu_cores: dict[str, float] = field(default_factory=dict)
    samples: dict[str, dict[str, list[Sample]]] = field(default_factory=dict)

    def add(self, figure: str, server: str, sample: Sample) -> None:
        self.samples.setdefault(figure, {}).setdefault(server, []).append(sample)


async def empty_caches(client: httpx.AsyncClient, server: Server) -> None:
    """Empty llama-server's KV cache (all slots), as EIE's is between requests; flush EIE's
    saved prefixes, so that every measurement is a cold prompt on both."""
    if server.flush_prefixes:
        r = await client.post(f"{server.base}/v1/admin/kv/flush", json={})
        if r.status_code != 200:
            raise RuntimeError(f"{server.name}: flushing the prefix cache failed: {r.status_code} {r.text[:300]}")
    for slot in range(server.erase_slots):
        r = await client.post(f"{server.base}/slots/{slot}", params={"action": "erase"})
        if r.status_code != 200:
            raise RuntimeError(f"{server.name}: erasing slot {slot} failed: {r.status_code} {r.text[:300]}")


class MeasureTimeout(Exception):
    pass


async def measure(client: httpx.AsyncClient, server: Server, figure: str, model: str, rep: int,
                  ttft_prompt: str, args: argparse.Namespace) -> Sample:
    if figure == "decode_tok_s":
        coro = measure_decode(client, server, model, rep, args.max_tokens)
    elif figure == "ttft_512_s":
        coro = measure_ttft(client, server, model, ttft_prompt)
    else:
        coro = measure_aggregate(client, server, model, rep, args.max_tokens)
    try:
        return await asyncio.wait_for(coro, timeout=args.measure_timeout)
    except asyncio.TimeoutError:
        raise MeasureTimeout(f"{figure} on {server.name} took over {args.measure_timeout:.0f}s") from None


async def run_repeat(run: ModelRun, servers: list[Server], model: str, rep: int, ttft_prompt: str,
                     args: argparse.Namespace) -> None:
    """One repeat: each figure on each server, in the given server order.

    Before each measurement wait for the machine to be quiet; a measurement during which other
    processes used more than --noise-limit cores is retried (bounded) and flagged if it stays noisy.
    """
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT, limits=httpx.Limits(max_connections=16)) as client:
        for figure in FIGURES:
            for server in servers:
                sample: Sample | None = None
                for attempt in range(1, args.retries + 2):
                    await empty_caches(client, server)
                    await asyncio.sleep(args.pause)
                    # the whole machine, both servers included, should be idle before a measurement
                    await wait_for_quiet([], args.noise_limit, args.max_wait_quiet)
                    try:
                        sample = await measure(client, server, figure, model, rep, ttft_prompt, args)
                    except MeasureTimeout as e:  # only ever seen next to a busy foreign process
                        if attempt > args.retries and sample is None:
                            raise RuntimeError(f"{e}, {attempt} times") from None
                        log(f"  rep {rep + 1} {figure:13s} {server.name:12s} timed out; retrying")
                        continue
                    sample.attempts = attempt
                    sample.noisy = sample.cpu["other_cores"] > args.noise_limit
                    log(f"  rep {rep + 1} {figure:13s} {server.name:12s} {sample.value:9.4f}  "
                        f"other-cpu {sample.cpu['other_cores']:.2f} cores{'  (noisy)' if sample.noisy else ''}")
                    if not sample.noisy:
                        break
                if sample is None:
                    raise RuntimeError(f"{figure} on {server.name}: no sample")
                run.add(figure, server.name, sample)


async def warm(servers: list[Server], model: str, warm_prompt: str) -> None:
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
        for server in servers:
            await warm_up(client, server, model, warm_prompt)


def prepare_prompts(llama: Server, repeats: int) -> tuple[list[tuple[str, int]], tuple[str, int]]:
    count = llama_tokenizer(llama)
    ttft = [fit_prompt(long_text(r), TTFT_PROMPT_TOKENS, count) for r in range(repeats)]
    warmup = fit_prompt(long_text(repeats + 11), TTFT_PROMPT_TOKENS, count)
    return ttft, warmup


def bench_model(spec: ModelSpec, binary: Path, workdir: Path, args: argparse.Namespace) -> ModelRun:
    eie, llama = make_servers(spec, binary, workdir, erase_slots=not args.keep_stale_kv)
    run = ModelRun(spec.name)
    try:
        llama.start()
        eie.start()
        ttft_prompts, (warm_prompt, _) = prepare_prompts(llama, args.repeats)
        log(f"{spec.name}: TTFT prompts have {[n for _, n in ttft_prompts]} tokens")
        asyncio.run(warm([eie, llama], spec.name, warm_prompt))
        time.sleep(1.0)
        run.idle_cpu_cores = idle_cpu([eie, llama])
        log(f"{spec.name}: idle CPU (cores) with both up: {run.idle_cpu_cores}")
        busy_idle = any(v > IDLE_CPU_LIMIT for v in run.idle_cpu_cores.values())
        run.mode = args.mode if args.mode != "auto" else ("alternate" if busy_idle else "both-up")
        if run.mode == "alternate":
            log(f"{spec.name}: running the servers one at a time")
            eie.stop()
            llama.stop()
        for rep in range(args.repeats):
            order = [eie, llama] if rep % 2 == 0 else [llama, eie]
            if run.mode == "both-up":
                asyncio.run(run_repeat(run, order, spec.name, rep, ttft_prompts[rep][0], args))
                continue
            for server in order:  # alternate: only the server under test is running
                server.start()
                try:
                    asyncio.run(warm([server], spec.name, warm_prompt))
                    asyncio.run(run_repeat(run, [server], spec.name, rep, ttft_prompts[rep][0], args))
                finally:
                    server.stop()
    finally:
        eie.stop()
        llama.stop()
    return run


# ---- report ------------------------------------------------------------------------------------


def summarize(run: ModelRun) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for figure in FIGURES:
        per = run.samples.get(figure, {})
        med = {name: statistics.median(s.value for s in samples) for name, samples in per.items()}
        eie, llama = med.get("eie"), med.get("llama-server")
        ratio = None
        if eie and llama:
            ratio = (llama / eie) if figure.startswith("ttft") else (eie / llama)
        figures[figure] = {
            "eie": eie,
            "llama_server": llama,
            "ratio": ratio,
            "ratio_means": "llama_ttft / eie_ttft" if figure.startswith("ttft") else "eie / llama-server",
            "goal": GOAL,
            "meets_goal": ratio is not None and ratio >= GOAL,
            "noisy_samples": sum(1 for samples in per.values() for x in samples if x.noisy),
            "runs": {name: [asdict(s) for s in samples] for name, samples in per.items()},
        }
    return {"model": run.model, "mode": run.mode, "idle_cpu_cores": run.idle_cpu_cores, "figures": figures}


LABELS = {"decode_tok_s": "decode tok/s (1 stream)", "ttft_512_s": "TTFT 512-tok prompt (s)",
          "agg4_tok_s": "aggregate tok/s (4 streams)"}


def format_table(summaries: list[dict[str, Any]]) -> str:
    head = f"{'model':14s} {'figure':28s} {'eie':>10s} {'llama-server':>13s} {'ratio':>7s} {'goal':>7s}  ok"
    lines = [head, "-" * len(head)]
    for s in summaries:
        for figure in FIGURES:
            f = s["figures"][figure]
            fmt = "{:10.4f}" if figure.startswith("ttft") else "{:10.1f}"
            ratio = f"{f['ratio']:7.3f}" if f["ratio"] is not None else "    n/a"
            lines.append(
                f"{s['model']:14s} {LABELS[figure]:28s} {fmt.format(f['eie'] or 0)} "
                f"{fmt.format(f['llama_server'] or 0):>13s} {ratio} {'>=' + str(GOAL):>7s}  "
                f"{'yes' if f['meets_goal'] else 'NO'}"
            )
    lines.append("ratio: eie/llama-server for tok/s, llama-server/eie for TTFT; >= 1.0 means EIE is as good or better")
    for s in summaries:
        idle = ", ".join(f"{k} {v:.3f}" for k, v in s["idle_cpu_cores"].items())
        lines.append(f"{s['model']}: servers {s['mode']}; idle CPU (cores): {idle}")
    return "\n".join(lines)


def noise_note(summaries: list[dict[str, Any]]) -> str | None:
    total = noisy = 0
    worst = 0.0
    for s in summaries:
        for f in s["figures"].values():
            for samples in f["runs"].values():
                total += len(samples)
                noisy += sum(1 for x in samples if x["noisy"])
                worst = max([worst, *(x["cpu"]["other_cores"] for x in samples)])
    if noisy:
        return (f"warning: {noisy} of {total} samples stayed noisy after retries (other processes used up to "
                f"{worst:.2f} cores); see runs[].cpu.other_cores in the JSON")
    return None


def git_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, timeout=30)
        return r.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty_files": len(git("status", "--porcelain").splitlines())}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def write_results(out: Path, report: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)


# ---- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", choices=[*MODELS, "all"])
    p.add_argument("--repeats", type=int, default=5, help="runs per figure; the median is reported")
    p.add_argument("--max-tokens", type=int, default=128, help="max_tokens of the decode and 4-stream requests")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    p.add_argument("--mode", default="auto", choices=["auto", "both-up", "alternate"],
                   help="both-up: both servers stay up (only when idle CPU is ~0); alternate: one at a time")
    p.add_argument("--pause", type=float, default=0.3, help="seconds between measurements")
    p.add_argument("--noise-limit", type=float, default=0.15,
                   help="cores other processes may use during a measurement before it is retried")
    p.add_argument("--retries", type=int, default=3, help="retries of a noisy measurement")
    p.add_argument("--max-wait-quiet", type=float, default=600.0,
                   help="seconds to wait for other processes to go quiet before each measurement")
    p.add_argument("--measure-timeout", type=float, default=60.0, help="seconds one measurement may take")
    p.add_argument("--keep-stale-kv", action="store_true",
                   help="do not erase llama-server's idle slots before each measurement (its default behaviour)")
    p.add_argument("--build-jobs", type=int, default=os.cpu_count() or 2)
    args = p.parse_args(argv)
    if not 1 <= args.repeats <= 100:
        p.error("--repeats must be between 1 and 100")
    if not 2 <= args.max_tokens <= 2048:
        p.error("--max-tokens must be between 2 and 2048")
    return args


def _sigterm(_signum: int, _frame: Any) -> None:
    raise SystemExit(143)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    specs = list(MODELS.values()) if args.model == "all" else [MODELS[args.model]]
    for spec in specs:
        if not (MODEL_DIR / spec.file).is_file():
            print(f"model file missing: {MODEL_DIR / spec.file} (run `make setup`)", file=sys.stderr)
            return 2
    binary = build_llama_server(args.build_jobs)
    started = dt.datetime.now(dt.timezone.utc)
    summaries = []
    with tempfile.TemporaryDirectory(prefix="eie-bench-") as tmp:
        try:
            for spec in specs:
                summaries.append(summarize(bench_model(spec, binary, Path(tmp), args)))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
    report = {
        "benchmark": "serve_vs_llama_server",
        "started_utc": started.isoformat(timespec="seconds"),
        "settings": {"repeats": args.repeats, "max_tokens": args.max_tokens, "ttft_prompt_tokens": TTFT_PROMPT_TOKENS,
                     "concurrent_streams": CONCURRENT_STREAMS, "temperature": 0.0, "goal": GOAL,
                     "llama_server_slots_erased_before_each_measurement": not args.keep_stale_kv,
                     "noise_limit_cores": args.noise_limit, "retries": args.retries},
        "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        "eie": {**git_state(), "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION},
        "llama_server": {"binary": str(binary), "version": llama_server_version(binary), "cmake_flags": CMAKE_FLAGS,
                         "flags": {s.name: llama_server_flags(s, Path("SLOT_DIR")) for s in specs}},
        "models": summaries,
    }
    write_results(args.out, report)
    print(format_table(summaries))
    note = noise_note(summaries)
    if note:
        print(note)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
