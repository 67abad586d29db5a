"""The thin layer over llama-cpp-python's low-level API: loading, tokens, logging, buffer sizes.

Only `engine/` imports `llama_cpp`. Everything here is synchronous and may block; callers run
it off the event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

import llama_cpp as lc
import numpy as np

from ..kv.ggml_rows import GGML_TYPES  # the KV types by name (also used from here)
from ..kv.migrate import rotation_sizes
from ..resources import heap
from ..resources.architectures import is_encoder
from ..resources.cores import CoreBudget
from . import backends, control_vector, gguf_checks, gguf_tensors, held_gil, k_centering
from .load_cancel import raise_if_set

log = logging.getLogger("eie.llama")


FLASH_ATTN = {
    "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}

_BUFFER_LINE = re.compile(
    r"^(?P<fn>\w+):\s+(?P<buf>\S+)\s+(?P<kind>model|KV|compute|output|RS)\b.*buffer size =\s+(?P<mib>[0-9.]+) MiB"
)


_HOLDS_LINE = re.compile(r"^\w+:\s+(?P<buf>\S+)\s+model buffer holds\s+(?P<mib>[0-9.]+) MiB of tensors")


class Capture(list):
    """The log lines of one load, in order; `errors` holds those llama.cpp logged as errors."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []


class _LogRouter:
    """Routes llama.cpp's log lines to Python logging and to the calling thread's capture, if any.

    llama.cpp has one global log callback and logs a load's buffer sizes on the thread that
    loads, so captures are per thread: models can load in parallel, each reading its own lines.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._callback = lc.llama_log_callback(self._on_log)
        lc.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        try:
            msg = text.decode("utf-8", errors="replace")
        except Exception:  # never let an exception cross into C
            return
        local = self._local
        line = getattr(local, "partial", "") + msg
        if not line.endswith("\n"):
            local.partial = line
            return
        local.partial = ""
        line = line.rstrip("\n")
        capture = getattr(local, "capture", None)
        if capture is not None:
            capture.append(line)
            if level == 4:
                capture.errors.append(line)
        if level == 4:  # GGML_LOG_LEVEL_ERROR
            log.error("%s", line)
        elif level == 3:
            log.warning("%s", line)
        else:
            log.debug("%s", line)

    def start_capture(self) -> "Capture":
        self._local.capture = Capture()
        return self._local.capture

    def stop_capture(self) -> None:
        self._local.capture = None


_router: _LogRouter | None = None
_init_lock = threading.Lock()


def init_backend() -> None:
    """Initialise llama.cpp once per process and take over its logging."""
    global _router
    with _init_lock:
        if _router is None:
            _router = _LogRouter()
            backends.registry.load()  # before llama_backend_init, which would search the cwd
            lc.llama_backend_init()


@contextlib.contextmanager
def log_capture() -> Iterator[Capture]:
    """llama.cpp's log lines of the calls made in the block, on this thread."""
    init_backend()
    assert _router is not None
    lines = _router.start_capture()
    try:
        yield lines
    finally:
        _router.stop_capture()


@dataclass(frozen=True)
class BufferSizes:
    """Bytes of the buffers llama.cpp allocated for one model, read from its own reports."""

    weights: int = 0
    kv: int = 0
    compute: int = 0
    output: int = 0
    # The part of each of the above in a GPU's own memory (not in a CPU or pinned host buffer).
    weights_device: int = 0
    kv_device: int = 0
    compute_device: int = 0
    output_device: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.output

    @property
    def device(self) -> int:
        """Bytes in GPU memory: what a GPU's budget is charged."""
        return self.weights_device + self.kv_device + self.compute_device + self.output_device


def on_host(buffer: str) -> bool:
    """Whether a llama.cpp buffer (by the name its log lines give) is in host memory: the CPU's own
    (CPU, CPU_Mapped, CPU_REPACK, AMX) or a GPU backend's pinned host buffers (CUDA_Host, ...)."""
    return buffer.startswith("CPU") or buffer == "AMX" or buffer.endswith("_Host")


def parse_buffer_sizes(lines: list[str]) -> BufferSizes:
    """A buffer mapped from the model file spans it from its first to its last tensor; where other
    buffers took tensors from inside that span (a GPU's layers, weights repacked for AMX), patch
    0010's next line says what it holds, and that is what it counts."""
    sizes = {"model": 0, "KV": 0, "RS": 0, "compute": 0, "output": 0}
    device = dict.fromkeys(sizes, 0)
    last_model: dict[str, int] = {}  # buffer name -> the bytes its last size line added
    for line in lines:
        m = _BUFFER_LINE.match(line.strip())
        if m:
            size = int(float(m.group("mib")) * 1024 * 1024)
            sizes[m.group("kind")] += size
            if not on_host(m.group("buf")):
                device[m.group("kind")] += size
            if m.group("kind") == "model":
                last_model[m.group("buf")] = size
            continue
        held = _HOLDS_LINE.match(line.strip())
        if held and held.group("buf") in last_model:
            change = int(float(held.group("mib")) * 1024 * 1024) - last_model.pop(held.group("buf"))
            sizes["model"] += change
            if not on_host(held.group("buf")):
                device["model"] += change
    return BufferSizes(
        weights=sizes["model"], kv=sizes["KV"] + sizes["RS"], compute=sizes["compute"], output=sizes["output"],
        weights_device=device["model"], kv_device=device["KV"] + device["RS"], compute_device=device["compute"],
        output_device=device["output"],
    )


class LoadError(Exception):
    pass


@dataclass(frozen=True)
class ContextArgs:
    n_ctx_total: int
    n_seq_max: int
    n_batch: int
    n_threads: int
    flash_attn: str
    n_outputs_max: int = 0  # logits rows one decode asks for at most (0: n_batch; resources/outputs.py)
    swa_full: bool = True  # sliding-window layers keep every cell (False: the window and a batch)
    # An embedding context: each decode pools its sequences' token states (llama_pooling_type
    # value; every token is an output) instead of giving logits.
    pooling: int | None = None


@dataclass
class LoadedModel:
    """A llama_model with one llama_context; freed with `free()`."""

    model: lc.llama_model_p
    ctx: lc.llama_context_p
    vocab: lc.llama_vocab_p
    n_ctx_total: int
    n_vocab: int
    buffers: BufferSizes
    metadata: dict[str, str]
    args: ContextArgs
    type_k: str
    type_v: str
    # K centring (engine/k_centering.py): the per-layer K means every context of this model
    # subtracts, unrotated; None when off.
    k_centers: np.ndarray | None = None
    # The control vector every context of this model applies (engine/control_vector.py); None: none.
    control: control_vector.ControlVector | None = None

    @property
    def n_swa(self) -> int:
        """The model's sliding window (0: none), whatever its cache keeps."""
        return max(0, lc.llama_model_n_swa(self.model))

    @property
    def swa_window(self) -> int:
        """The attention window of the model's sliding-window layers when their cache keeps only
        the window (plus a batch) and may reuse cells that fall out of it; 0 when it keeps them all."""
        n_swa = lc.llama_model_n_swa(self.model)
        if self.args.swa_full or n_swa <= 0:
            return 0
        per_sequence = self.n_ctx_total // max(self.args.n_seq_max, 1)
        ring = -(-(n_swa + self.args.n_batch) // 256) * 256  # llama.cpp pads it to 256 cells
        return n_swa if ring < per_sequence else 0

    def swap_context(self, ctx: lc.llama_context_p, buffers: BufferSizes, type_k: str, type_v: str) -> None:
        """Install a context from `new_context`, freeing the current one."""
        self.drop_context()
        self.install_context(ctx, buffers, type_k, type_v)

    def drop_context(self) -> None:
        """Free the context and keep the weights: a KV type change frees the old context before
        it creates the new one (its sequences wait in host memory meanwhile)."""
        if self.ctx:
            lc.llama_free(self.ctx)
            self.ctx = None
        heap.trim()

    def install_context(self, ctx: lc.llama_context_p, buffers: BufferSizes, type_k: str, type_v: str) -> None:
        """Make a context from `new_context` this model's context (after `drop_context`)."""
        assert not self.ctx, "drop the current context first"
        self.ctx, self.buffers, self.type_k, self.type_v = ctx, buffers, type_k, type_v

    def free(self) -> None:
        if self.ctx:
            lc.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            lc.llama_model_free(self.model)
            self.model = None
        heap.trim()


def _read_metadata(model: lc.llama_model_p) -> dict[str, str]:
    out: dict[str, str] = {}
    buf = ctypes.create_string_buffer(1 << 16)
    key = ctypes.create_string_buffer(512)
    for i in range(lc.llama_model_meta_count(model)):
        if lc.llama_model_meta_key_by_index(model, i, key, len(key)) < 0:
            continue
        n = lc.llama_model_meta_val_str_by_index(model, i, buf, len(buf))
        if n < 0:
            continue
        if n >= len(buf):  # long values (chat templates) need a bigger buffer
            big = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str_by_index(model, i, big, len(big))
            val = big.value
        else:
            val = buf.value
        out[key.value.decode("utf-8", "replace")] = val.decode("utf-8", "replace")
    return out


def read_header(path: Path, trial: bool = False) -> dict[str, str]:
    """A GGUF file's metadata (as strings) plus `n_vocab`, through llama.cpp's vocab-only load.

    The `gguf` package parses every token string eagerly (about 12 s for Gemma 3's 262k-token
    vocabulary on this machine); llama.cpp reads the same header in about 0.5 s.

    With `trial` the model is loaded whole instead (mapped, on the CPU, weights not repacked: none
    is read) and given a small context, whose graphs llama.cpp builds: the steps where a malformed
    file makes it abort the process (engine/gguf_header.py runs this in a child).
    """
    init_backend()
    if not path.is_file():
        raise ValueError(f"model file not found: {path}")
    params = lc.llama_model_default_params()
    if trial:
        params.use_mmap = True
        params.n_gpu_layers = 0
        params.use_extra_bufts = False
    else:
        params.vocab_only = True
    assert _router is not None
    lines = _router.start_capture()
    model = None
    try:
        model = lc.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise ValueError(f"{path.name} is not a model llama.cpp can read: "
                             f"{_load_error(lines) or 'no reason given'}")
        if trial:  # a context as the server makes one, small: llama.cpp builds its graphs
            ctx = _create_context(model, _TRIAL_CONTEXT, "f16", "f16")
            if not ctx:
                raise ValueError(f"llama.cpp could not make a context for {path.name}: "
                                 f"{_last_error(lines) or 'no reason given'}")
            lc.llama_free(ctx)
        meta = _read_metadata(model)
        meta["n_vocab"] = str(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model)))
    finally:
        _router.stop_capture()
        if model:
            lc.llama_model_free(model)
            heap.trim()
    if trial:
        problem = gguf_checks.decode_problem(meta, gguf_tensors.table(path))
        if problem:
            raise ValueError(f"{path.name} would make llama.cpp abort when decoding: {problem}")
    return meta


_TRIAL_CONTEXT = ContextArgs(n_ctx_total=256, n_seq_max=1, n_batch=32, n_threads=1, flash_attn="auto")


TURBO_TYPES = {"turbo4", "turbo3", "turbo2"}


def build_has_turboquant() -> bool:
    """Whether the llama.cpp libraries in use carry the TurboQuant KV types (native/patches)."""
    lib = Path(lc.__file__).parent / "lib" / "libggml-base.so"
    try:
        return hasattr(ctypes.CDLL(str(lib)), "quantize_row_turbo4_ref")
    except OSError:
        return False


# libggml-<key>* next to llama_cpp's libraries names the GPU backend a build offloads to.
_GPU_LIBS = (("cuda", "CUDA"), ("hip", "HIP"), ("musa", "MUSA"), ("sycl", "SYCL"), ("vulkan", "Vulkan"),
             ("metal", "Metal"), ("opencl", "OpenCL"))


def gpu_backend() -> str | None:
    """The GPU backend `load` offloads models to, or None when they run on the CPU.

    llama.cpp offloads when it has a GPU device (llama_supports_gpu_offload) and n_gpu_layers,
    which `load` leaves at llama.cpp's default (all layers), is not 0. The backend is named after
    its libggml-<name> library next to llama_cpp's; a statically linked one is just "GPU".
    """
    init_backend()
    if not lc.llama_supports_gpu_offload() or lc.llama_model_default_params().n_gpu_layers == 0:
        return None
    registered = backends.registry.gpu_backend()  # the loaded module's name (CUDA, ROCm, ...)
    if registered:
        return registered
    libdir = Path(lc.__file__).parent / "lib"
    for key, name in _GPU_LIBS:
        if any(libdir.glob(f"libggml-{key}*")):
            return name
    return "GPU"


def turbo_offload_problem(type_k: str, type_v: str, backend: str | None) -> str | None:
    """Why these KV types cannot run on `backend` (TurboQuant has CPU kernels only), or None."""
    turbo = next((t for t in (type_v, type_k) if t in TURBO_TYPES), None)
    if turbo is None or backend is None:
        return None
    return f"{turbo} KV cache has no {backend} kernels in this build; use q8_0/q4_0 or run on CPU"


def load(
    path: Path,
    *,
    n_ctx_total: int,
    n_seq_max: int,
    n_batch: int,
    n_threads: int,
    type_k: str,
    type_v: str,
    flash_attn: str,
    center_k: bool = False,
    cache_dir: Path | None = None,
    cores: CoreBudget | None = None,
    cancel: threading.Event | None = None,
    n_gpu_layers: int = -1,
    n_outputs_max: int = 0,
    swa_full: bool = True,
    pooling: str | None = None,
    control_vectors: Sequence[tuple[Path, float]] = (),
    control_layers: Sequence[int] | None = None,
) -> LoadedModel:
    """Load weights and create one context with `n_seq_max` sequences, one KV stream each.

    With `center_k`, keys are stored minus the model's mean key (engine/k_centering.py) where
    the model allows it; the means are cached under `cache_dir`, and measuring them takes its
    threads from `cores`. Once `cancel` is set, the load stops at its next check and raises
    LoadCancelled (engine/load_cancel.py). Where llama.cpp has a GPU, the last `n_gpu_layers`
    layers go to it (negative: all; resources/offload.py). `n_outputs_max` bounds the logits rows
    of one decode (0: n_batch), and with them the compute buffer (resources/outputs.py). Without
    `swa_full`, sliding-window layers keep only the window and a batch of cells per sequence.
    With `pooling` (auto, mean, cls, last) the context gives one embedding per sequence instead of
    logits; auto takes the GGUF's pooling type, or mean where it names none (a generative model).
    `control_vectors` ((file, scale) pairs) are summed into a control vector acting on
    `control_layers` (default: all), which every context of the model applies.
    """
    init_backend()
    if not path.is_file():
        raise LoadError(f"model file not found: {path}")
    check_kv_types(type_k, type_v)
    assert _router is not None
    lines = _router.start_capture()
    model = None
    try:
        mparams = lc.llama_model_default_params()
        mparams.use_mmap = True
        mparams.n_gpu_layers = n_gpu_layers
        if cancel is not None:  # llama.cpp stops reading tensors when the callback returns false
            progress = lc.llama_progress_callback(lambda _progress, _data: not cancel.is_set())
            mparams.progress_callback = progress
        model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        raise_if_set(cancel)
        if not model:
            raise LoadError(f"llama.cpp could not load {path.name}: {_load_error(lines) or 'no reason given'}")
        metadata = _read_metadata(model)
        arch = metadata.get("general.architecture", "")
        if pooling is None and is_encoder(arch):
            raise LoadError(f"{path.name} is a sentence encoder (architecture {arch}: no KV cache, no output "
                            "layer), which can only embed: set models[].embedding: true")
        args = ContextArgs(n_ctx_total, n_seq_max, n_batch, n_threads, flash_attn, n_outputs_max, swa_full,
                           None if pooling is None else _pooling_type(pooling, metadata))
        ctx = _create_context(model, args, type_k, type_v)
        if not ctx:
            raise LoadError(_last_error(lines) or "llama.cpp could not create a context")
        if lc.llama_pooling_type(ctx) == lc.LLAMA_POOLING_TYPE_RANK and not set(_RANK_HEAD) & set(gguf_tensors.table(path)):
            lc.llama_free(ctx)
            raise LoadError(f"{path.name} has no classification head ({' or '.join(_RANK_HEAD)}), which pooling "
                            "rank scores with: it cannot rerank")
        vocab = lc.llama_model_get_vocab(model)
        loaded = LoadedModel(
            model=model,
            ctx=ctx,
            vocab=vocab,
            n_ctx_total=lc.llama_n_ctx(ctx),
            n_vocab=lc.llama_vocab_n_tokens(vocab),
            buffers=parse_buffer_sizes(lines),
            metadata=metadata,
            args=args,
            type_k=type_k,
            type_v=type_v,
        )
        try:
            raise_if_set(cancel)
            if control_vectors:
                loaded.control = _steer(loaded, control_vectors, control_layers)
            if center_k:
                _center(loaded, path, cache_dir, cores, lines, cancel)
        except BaseException:
            lc.llama_free(ctx)
            raise
        model = None
        return loaded
    finally:
        if model:  # the load failed or was cancelled
            lc.llama_model_free(model)
            heap.trim()
        _router.stop_capture()


def _steer(loaded: LoadedModel, files: Sequence[tuple[Path, float]],
           layers: Sequence[int] | None) -> control_vector.ControlVector:
    """Read the model's control vector and apply it to the context (LoadError when a file cannot
    steer this model)."""
    n_embd, n_layer = lc.llama_model_n_embd(loaded.model), lc.llama_model_n_layer(loaded.model)
    try:
        cv = control_vector.read(files, n_embd, n_layer, layers)
        control_vector.apply(loaded.ctx, cv)
    except control_vector.ControlVectorError as e:
        raise LoadError(str(e)) from e
    return cv


def _center(loaded: LoadedModel, path: Path, cache_dir: Path | None, cores: CoreBudget | None,
            lines: list[str], cancel: threading.Event | None = None) -> None:
    """Measure (or read) the K means and apply them to the context; off, with a log line, where
    the model or the build does not allow it. `lines` is the load's log capture."""
    reason = k_centering.unsupported_reason(loaded.metadata, gpu_backend())
    if reason is None and not k_centering.available():
        reason = "this llama.cpp build has no llama_set_k_centers"
    if reason:
        log.info("K centring off for %s: %s", path.name, reason)
        return
    try:
        centers = k_centering.centers_for(loaded.model, path, loaded.args.n_threads, cache_dir, cores, cancel)
        loaded.buffers = _apply_centers(loaded.ctx, centers, loaded.type_k, loaded.metadata, loaded.buffers, lines)
    except k_centering.CenteringError as e:  # an optimisation of the cache: serve without it
        log.warning("K centring off for %s: %s", path.name, e)
        return
    loaded.k_centers = centers


def _apply_centers(ctx: lc.llama_context_p, centers: np.ndarray, type_k: str, metadata: dict[str, str],
                   buffers: BufferSizes, lines: list[str]) -> BufferSizes:
    """Apply the K centres; llama.cpp then reserves its compute buffers again for the graphs with
    the subtraction, and the sizes it reports replace the first ones."""
    mark = len(lines)
    k_centering.apply(ctx, centers, type_k, rotation_sizes(metadata)[0])
    again = parse_buffer_sizes(lines[mark:])
    return dataclasses.replace(buffers, compute=again.compute, compute_device=again.compute_device) if again.compute else buffers


def check_kv_types(type_k: str, type_v: str) -> None:
    """Raise LoadError when this build cannot hold these KV types (TurboQuant missing or on a GPU)."""
    if {type_k, type_v} & TURBO_TYPES and not build_has_turboquant():
        raise LoadError("this llama.cpp build has no TurboQuant KV types; rebuild it with `make setup`")
    problem = turbo_offload_problem(type_k, type_v, gpu_backend())
    if problem:
        raise LoadError(problem)


POOLING_TYPES = {"mean": lc.LLAMA_POOLING_TYPE_MEAN, "cls": lc.LLAMA_POOLING_TYPE_CLS,
                 "last": lc.LLAMA_POOLING_TYPE_LAST, "rank": lc.LLAMA_POOLING_TYPE_RANK}
# A cross-encoder's classification head (llama.cpp's LLM_TENSOR_CLS and LLM_TENSOR_CLS_OUT): rank
# pooling without either would score a hidden state's first value.
_RANK_HEAD = ("cls.weight", "cls.output.weight")


def _pooling_type(pooling: str, metadata: dict[str, str]) -> int:
    if pooling != "auto":
        return POOLING_TYPES[pooling]
    named = any(k.endswith(".pooling_type") and v not in ("0", "-1") for k, v in metadata.items())
    return lc.LLAMA_POOLING_TYPE_UNSPECIFIED if named else lc.LLAMA_POOLING_TYPE_MEAN


def _create_context(model: lc.llama_model_p, args: ContextArgs, type_k: str, type_v: str) -> lc.llama_context_p:
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = args.n_ctx_total
    cparams.n_batch = args.n_batch
    cparams.n_ubatch = args.n_batch
    cparams.n_seq_max = args.n_seq_max
    if args.n_outputs_max:  # llama.cpp needs room for one row per sequence
        cparams.n_outputs_max = max(args.n_seq_max, min(args.n_batch, args.n_outputs_max))
    cparams.n_threads = args.n_threads
    cparams.n_threads_batch = args.n_threads
    cparams.type_k = GGML_TYPES[type_k]
    cparams.type_v = GGML_TYPES[type_v]
    cparams.flash_attn_type = FLASH_ATTN[args.flash_attn]
    # One KV stream per sequence: attention for a sequence then runs over its own cells
    # only, so its output does not depend on what the other sequences hold, and greedy
    # results match a solo run (a unified cache interleaves cells and changes the sums).
    cparams.kv_unified = False
    cparams.swa_full = args.swa_full
    if args.pooling is not None:
        cparams.embeddings = True
        cparams.pooling_type = args.pooling
        # Pooling sums a sequence's states within one ubatch: a split KV splits a batch of
        # sequences of unequal lengths into equal shares, and a sequence's tail would be pooled alone.
        cparams.kv_unified = True
    cparams.no_perf = True
    return lc.llama_init_from_model(model, cparams)


def new_context(loaded: LoadedModel, type_k: str, type_v: str) -> tuple[lc.llama_context_p, BufferSizes]:
    """A context on the model's weights with the given KV types (for migrating sequences).

    The caller frees it, or installs it with `LoadedModel.swap_context` or `install_context`.
    """
    check_kv_types(type_k, type_v)
    with log_capture() as lines:
        ctx = _create_context(loaded.model, loaded.args, type_k, type_v)
        if not ctx:
            raise LoadError(_last_error(lines) or "llama.cpp could not create a context")
        fresh = parse_buffer_sizes(lines)
        if loaded.control is not None:  # the same vector as every context of this model
            try:
                control_vector.apply(ctx, loaded.control)
            except control_vector.ControlVectorError:
                lc.llama_free(ctx)
                raise
        if loaded.k_centers is not None:  # the same means as every context of this model
            try:
                fresh = _apply_centers(ctx, loaded.k_centers, type_k, loaded.metadata, fresh, lines)
            except k_centering.CenteringError:
                lc.llama_free(ctx)
                raise
    return ctx, dataclasses.replace(fresh, weights=loaded.buffers.weights, weights_device=loaded.buffers.weights_device)


def _is_error(line: str) -> bool:
    low = line.lower()
    return "error" in low or "failed" in low or "invalid" in low


def _last_error(lines: list[str]) -> str | None:
    return next((line.strip() for line in reversed(lines) if _is_error(line)), None)


# What llama.cpp's model loaders log after the line that says why: they only repeat that it failed.
_LOAD_FAILED = re.compile(r"failed to (load model|read header)\b")
_ERROR_PREFIX = re.compile(r"^(\w+: )?(error loading model: )?(\w+: )?")


def _load_error(lines: Capture) -> str | None:
    """Why llama.cpp did not load a model file: the first error it logged that names the cause (a
    tensor outside the file, a missing tensor, a bad magic or version), without its function
    prefixes; the generic last line when there is none."""
    cause = next((line for line in lines.errors if not _LOAD_FAILED.search(line)), None)
    if cause is None:
        return _last_error(lines)
    return _ERROR_PREFIX.sub("", cause.strip(), count=1) or cause.strip()


class FimTokens(NamedTuple):
    """A vocabulary's fill-in-the-middle tokens, as llama.cpp finds them (-1: none)."""

    pre: int
    suf: int
    mid: int
    rep: int
    sep: int

    @property
    def usable(self) -> bool:
        return min(self.pre, self.suf, self.mid) >= 0


class NotReady(Exception):
    """The model is not loaded (not yet, failed, or unloaded)."""


class _Lifetime:
    """A model's memory against its users off the runner's thread (tokenizing a request, making
    its grammar): a use runs while the model lives, its free (`end`) waits for the uses under way,
    and a later use raises NotReady instead of reading freed memory."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._alive = True

    def enter(self) -> None:
        with self._cond:
            if not self._alive:
                raise NotReady("the model was unloaded")
            self._users += 1

    def leave(self) -> None:
        with self._cond:
            self._users -= 1
            if not self._users:
                self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._alive = False
            while self._users:
                self._cond.wait()


class Vocab:
    """Tokenization and detokenization for one model; usable until `close()` (before its model
    is freed), NotReady after."""

    def __init__(self, vocab: lc.llama_vocab_p, n_vocab: int):
        self._vocab = vocab
        self._life = _Lifetime()
        self.n_vocab = n_vocab
        self.add_bos = bool(lc.llama_vocab_get_add_bos(vocab))
        self.bos = int(lc.llama_vocab_bos(vocab))
        self.eos = int(lc.llama_vocab_eos(vocab))
        self.sep = int(lc.llama_vocab_sep(vocab))
        self.add_eos = bool(lc.llama_vocab_get_add_eos(vocab))
        self.add_sep = bool(lc.llama_vocab_get_add_sep(vocab))
        self._piece_buf = ctypes.create_string_buffer(256)
        self._eog = {t for t in range(n_vocab) if lc.llama_vocab_is_eog(vocab, t)} if n_vocab <= 1_000_000 else set()
        self.bos_text = self.piece(self.bos, special=True).decode("utf-8", "replace") if self.bos >= 0 else ""
        self.eos_text = self.piece(self.eos, special=True).decode("utf-8", "replace") if self.eos >= 0 else ""
        # fill-in-the-middle tokens (-1: none): prefix, suffix, middle, repository, file separator
        self.fim = FimTokens(*(int(f(vocab)) for f in (lc.llama_vocab_fim_pre, lc.llama_vocab_fim_suf,
                                                       lc.llama_vocab_fim_mid, lc.llama_vocab_fim_rep,
                                                       lc.llama_vocab_fim_sep)))

    @property
    def handle(self) -> lc.llama_vocab_p:
        """llama.cpp's vocab, for what needs it directly (grammar.Constraint), inside `using()`."""
        return self._vocab

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """The vocab stays alive meanwhile (NotReady where it is already closed)."""
        self._life.enter()
        try:
            yield
        finally:
            self._life.leave()

    def close(self) -> None:
        """Its model is about to be freed: waits for the uses under way; later ones raise NotReady."""
        self._life.end()

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (lc.llama_token * cap)()
        self._life.enter()
        try:
            n = lc.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
            if n < 0:
                cap = -n
                arr = (lc.llama_token * cap)()
                n = lc.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        finally:
            self._life.leave()
        return list(arr[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        buf = self._piece_buf
        self._life.enter()
        try:
            n = held_gil.token_to_piece(self._vocab, token, buf, len(buf), 0, special)
            if n < 0:
                big = ctypes.create_string_buffer(-n)
                n = held_gil.token_to_piece(self._vocab, token, big, len(big), 0, special)
                return big.raw[:n]
            return buf.raw[:n]
        finally:
            self._life.leave()

    def text(self, tokens: list[int], special: bool = False) -> str:
        """The tokens' pieces as one text (special tokens written out when `special`), invalid
        UTF-8 replaced."""
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    @property
    def eog_tokens(self) -> frozenset[int]:
        """The tokens that end a generation (EOS, EOT, ...)."""
        return frozenset(self._eog)
