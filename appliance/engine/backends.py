"""ggml backends as loadable modules (GGML_BACKEND_DL): find them, score them, load the best.

Every EIE build compiles llama.cpp with `GGML_BACKEND_DL=ON`: the CPU backend (one module in the
setup build, one per CPU generation in the release build) and the GPU backends (CUDA, HIP, ...)
are shared modules that ggml loads at run time. llama-cpp-python 0.3.36 binds none of the
`ggml_backend_*` functions, so they are bound here with ctypes, through the very libggml that
libllama was linked against: the wheel holds several copies of it (`libggml.so`, `.so.0`, ...)
and every copy has its own backend registry, so opening another one would register the backends
where llama.cpp never looks.

The modules are loaded from where the build put them: llama-cpp-python installs `ggml-cpu` and
the GPU modules next to libllama (`llama_cpp/lib`), and ggml installs the CPU variants of
`GGML_CPU_ALL_VARIANTS` into `bin/` beside the package; the frozen build gathers all of them in
`llama_cpp/lib`. For each backend the module with the highest `ggml_backend_score` wins (0: not
supported by this machine), as ggml's own `ggml_backend_load_best` would choose, but here every
candidate and its score is kept for `eie doctor`. Loading must happen before
`llama_backend_init`, which otherwise searches the executable's directory and the current
directory (see `native.init_backend`).
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as lc

from ..shared_library import open_library

# ggml_backend_load_all's order: GPU backends register their devices before the CPU.
_ORDER = ("blas", "zendnn", "cann", "cuda", "hip", "metal", "rpc", "sycl", "vulkan", "virtgpu", "opencl",
          "hexagon", "musa", "openvino", "cpu")
_MODULE = re.compile(r"^libggml-(?P<name>[a-z0-9]+)(?:-(?P<variant>[A-Za-z0-9_.]+))?\.so$")
_LIBGGML = re.compile(r"^libggml\.so(\.\d+)*$")

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


@dataclass(frozen=True)
class Candidate:
    """One module file of a backend and what this machine made of it."""

    path: str
    score: int | None  # None: the module has no score function (a backend without variants)
    error: str | None = None


@dataclass
class Backend:
    """A backend name (`cpu`, `cuda`, ...) with its candidate modules and the one loaded."""

    name: str
    candidates: list[Candidate] = field(default_factory=list)
    chosen: str | None = None
    score: int | None = None
    registered: str | None = None  # the registry's name for it (CPU, CUDA, ROCm, ...)
    error: str | None = None


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    type: str
    backend: str
    free_bytes: int
    total_bytes: int


class _Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def libggml_path() -> Path:
    """The libggml that libllama uses: the one mapped into this process by the dynamic loader."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and _LIBGGML.match(os.path.basename(parts[5].strip())):
                    return Path(parts[5].strip())
    except OSError:
        pass
    return Path(lc.__file__).parent / "lib" / "libggml.so"  # no /proc: the copy llama_cpp ships


def _bind(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    sigs = {
        "ggml_backend_load": (vp, [cp]),
        "ggml_backend_reg_count": (sz, []),
        "ggml_backend_reg_get": (vp, [sz]),
        "ggml_backend_reg_name": (cp, [vp]),
        "ggml_backend_reg_get_proc_address": (vp, [vp, cp]),
        "ggml_backend_dev_count": (sz, []),
        "ggml_backend_dev_get": (vp, [sz]),
        "ggml_backend_dev_name": (cp, [vp]),
        "ggml_backend_dev_description": (cp, [vp]),
        "ggml_backend_dev_memory": (None, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
        "ggml_backend_dev_type": (ctypes.c_int, [vp]),
        "ggml_backend_dev_backend_reg": (vp, [vp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def module_dirs(libggml: Path) -> list[Path]:
    """Where the build put the backend modules, in order of preference."""
    dirs = [libggml.parent, Path(lc.__file__).parent / "lib", Path(lc.__file__).parent.parent / "bin"]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def find_modules(dirs: list[Path]) -> dict[str, list[Path]]:
    """Backend name -> module files (the first directory wins for a file name)."""
    seen: dict[str, Path] = {}
    for d in dirs:
        for p in sorted(d.iterdir()):
            if _MODULE.match(p.name) and p.name != "libggml-base.so" and p.name not in seen and p.is_file():
                seen[p.name] = p
    found: dict[str, list[Path]] = {}
    for name, p in seen.items():
        found.setdefault(_MODULE.match(name).group("name"), []).append(p)
    return dict(sorted(found.items(), key=lambda kv: (_ORDER.index(kv[0]) if kv[0] in _ORDER else len(_ORDER) - 1,
                                                       kv[0])))


def _probe(path: Path) -> Candidate:
    """Open a module and ask its score (0: this machine lacks what it was built for)."""
    try:
        mod = open_library(path)
    except OSError as e:
        return Candidate(str(path), None, str(e))
    fn = getattr(mod, "ggml_backend_score", None)
    if fn is None:
        return Candidate(str(path), None)
    fn.restype, fn.argtypes = ctypes.c_int, []
    return Candidate(str(path), int(fn()))


def choose(name: str, files: list[Path]) -> Backend:
    """ggml's rule: the variant (`libggml-<name>-<variant>.so`) with the highest score above 0,
    else the plain module (`libggml-<name>.so`) unless it scores 0."""
    backend = Backend(name, [_probe(p) for p in files])
    variants = [c for c in backend.candidates if _MODULE.match(Path(c.path).name).group("variant")]
    best = max((c for c in variants if c.score), key=lambda c: c.score, default=None)
    if best is None:
        plain = [c for c in backend.candidates if c not in variants]
        best = next((c for c in plain if c.error is None and c.score != 0), None)
    if best is None:
        reasons = [f"{Path(c.path).name}: {c.error or 'score 0, not supported on this machine'}"
                   for c in backend.candidates]
        backend.error = "no usable module (" + "; ".join(reasons) + ")"
    else:
        backend.chosen, backend.score = best.path, best.score
    return backend


class Registry:
    """ggml's backend registry in this process, loaded once from the build's modules."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self.backends: list[Backend] = []
        self.dirs: list[Path] = []
        self.libggml: Path | None = None

    @property
    def loaded(self) -> bool:
        return self._lib is not None

    @property
    def lib(self) -> ctypes.CDLL:
        self.load()
        assert self._lib is not None
        return self._lib

    def load(self) -> list[Backend]:
        """Load the best module of every backend found (once); later calls return the result."""
        with self._lock:
            if self._lib is not None:
                return self.backends
            self.libggml = libggml_path()
            lib = _bind(self.libggml)
            if lib.ggml_backend_reg_count() == 0:  # nobody loaded anything yet: ours to do
                self.dirs = module_dirs(self.libggml)
                for name, files in find_modules(self.dirs).items():
                    backend = choose(name, files)
                    if backend.chosen:
                        reg = lib.ggml_backend_load(backend.chosen.encode())
                        if reg:
                            backend.registered = lib.ggml_backend_reg_name(reg).decode()
                        else:
                            backend.error = f"ggml_backend_load failed for {backend.chosen}"
                    self.backends.append(backend)
            self._lib = lib
            return self.backends

    def devices(self) -> list[Device]:
        """Every registered device with its memory as its backend reports it (never raises)."""
        lib = self.lib
        out = []
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            reg = lib.ggml_backend_dev_backend_reg(dev)
            out.append(Device(
                name=(lib.ggml_backend_dev_name(dev) or b"").decode(),
                description=(lib.ggml_backend_dev_description(dev) or b"").decode(),
                type=DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
                backend=(lib.ggml_backend_reg_name(reg) or b"").decode() if reg else "",
                free_bytes=free.value,
                total_bytes=total.value,
            ))
        return out

    def features(self) -> dict[str, dict[str, str]]:
        """Per registered backend, the features it reports (the CPU: SSE3, AVX2, ...)."""
        lib = self.lib
        out: dict[str, dict[str, str]] = {}
        for i in range(lib.ggml_backend_reg_count()):
            reg = lib.ggml_backend_reg_get(i)
            name = lib.ggml_backend_reg_name(reg).decode()
            addr = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
            if not addr:
                continue
            get = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(addr)
            feats = get(reg)
            items: dict[str, str] = {}
            j = 0
            while feats and feats[j].name:
                items[feats[j].name.decode()] = (feats[j].value or b"").decode()
                j += 1
            out[name] = items
        return out

    def gpu_backend(self) -> str | None:
        """The registry name of the first GPU device's backend, or None without a GPU device."""
        return next((d.backend for d in self.devices() if d.type in ("gpu", "igpu")), None)


registry = Registry()
