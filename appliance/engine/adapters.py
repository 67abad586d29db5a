"""LoRA adapters of a loaded model (llama.cpp's llama_adapter_lora).

A model's adapters load with its weights and live as long as they do. llama.cpp applies adapters
to a whole context, not to a sequence, so the runner decodes the sequences of one adapter set at
a time (`AdapterSwitch`); a set is the tuple of (adapter index, scale) pairs with a non-zero scale,
() being the model itself. Changing the set makes llama.cpp reserve its compute graph again at
the next decode, which is the price of switching (engine/adapter_turns.py makes the sets take
turns long enough to pay it rarely).
"""

from __future__ import annotations

import ctypes
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as lc

from . import native
from .prefix import file_sha256

AdapterSet = tuple[tuple[int, float], ...]
BASE: AdapterSet = ()

_BUFFER = re.compile(r"LoRA buffer size =\s+(?P<mib>[0-9.]+) MiB")
_CAUSE = re.compile(r"^\w+: (failed to apply lora adapter: )?")
_RESERVE = re.compile(r"reserve took (?P<ms>[0-9.]+) ms")


def lora_set(index: int, scale: float) -> AdapterSet:
    """The set of one adapter at `scale` (none at scale 0)."""
    return ((index, float(scale)),) if scale else BASE


class AdapterError(Exception):
    """An adapter file llama.cpp did not take (not an adapter, another architecture or shape)."""


@dataclass(frozen=True)
class LoadedAdapter:
    name: str
    path: Path
    handle: object  # llama_adapter_lora_p, freed with the model
    bytes: int  # the buffers llama.cpp allocated for its tensors
    digest: str  # content hash: part of a prefix cache key for states computed with it


def load(model: lc.llama_model_p, adapters: list[tuple[str, Path]]) -> list[LoadedAdapter]:
    """Load each (name, path) onto `model`; AdapterError names the first one llama.cpp refused."""
    out: list[LoadedAdapter] = []
    for name, path in adapters:
        if not path.is_file():
            raise AdapterError(f"LoRA adapter {name!r}: file not found: {path}")
        with native.log_capture() as lines:
            handle = lc.llama_adapter_lora_init(model, str(path).encode())
        if not handle:
            cause = next((_CAUSE.sub("", line.strip()) for line in reversed(lines.errors)), "no reason given")
            raise AdapterError(f"LoRA adapter {name!r} ({path.name}) does not fit this model: {cause}")
        if lc.llama_adapter_get_alora_n_invocation_tokens(handle):
            # llama-server starts such an adapter at its invocation tokens in the prompt; here it
            # would apply to every token, which is not what it was trained for
            lc.llama_adapter_lora_free(handle)
            raise AdapterError(f"LoRA adapter {name!r} ({path.name}) is an activated LoRA (it has invocation "
                               "tokens), which this server does not serve")
        size = sum(int(float(m.group("mib")) * 1024 * 1024) for line in lines if (m := _BUFFER.search(line)))
        out.append(LoadedAdapter(name, path, handle, size, file_sha256(path)))
    return out


def identity(adapters: list[LoadedAdapter], chosen: AdapterSet) -> bytes:
    """What a KV state computed with `chosen` depends on beyond the model: each adapter's content
    and scale (b"" for the model itself, whose keys stay as they were)."""
    if not chosen:
        return b""
    material = "|".join(f"{adapters[i].digest}:{scale!r}" for i, scale in chosen)
    return hashlib.blake2b(material.encode(), digest_size=16).digest()


class AdapterSwitch:
    """Which adapter set a context decodes with; a new context starts with none. After a change,
    the decode that reserves the scheduler again reports what that took and the compute buffer
    the set needs (`reserved`)."""

    def __init__(self, adapters: list[LoadedAdapter]):
        self.adapters = adapters
        self.current: AdapterSet = BASE
        self.reserve_pending = False  # the set changed: the next decode reserves the scheduler
        self.compute_peak = 0  # the largest compute buffer a reserve with a set reported (bytes)
        n = len(adapters)
        self._handles = (lc.llama_adapter_lora_p_ctypes * max(n, 1))(*(a.handle for a in adapters))
        self._scales = (ctypes.c_float * max(n, 1))()

    def use(self, ctx: lc.llama_context_p, chosen: AdapterSet) -> bool:
        """Set `chosen` on the context; whether that changed it (the next decode reserves again)."""
        if chosen == self.current:
            return False
        for i in range(len(self.adapters)):
            self._scales[i] = 0.0
        for i, scale in chosen:
            self._scales[i] = scale
        lc.llama_set_adapters_lora(ctx, self._handles, len(self.adapters), self._scales)
        self.current = chosen
        self.reserve_pending = True
        return True

    def reserved(self, lines: list[str]) -> float | None:
        """Read llama.cpp's log `lines` of the decode after a change: the seconds its scheduler
        reserve took (None: it did not reserve), and the compute buffer it allocated."""
        self.reserve_pending = False
        took = [float(m.group("ms")) / 1000 for line in lines if (m := _RESERVE.search(line))]
        if not took:
            return None
        self.compute_peak = max(self.compute_peak, native.parse_buffer_sizes(lines).compute)
        return sum(took)

    def new_context(self) -> None:
        """The runner made a new context (a KV type change): it has no adapters set."""
        self.current = BASE
        self.reserve_pending = False
        self.compute_peak = 0
