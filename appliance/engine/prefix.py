"""The runner's side of the prefix cache: which prefix of a prompt to save and restore, and
moving sequence states between a llama.cpp context and a PrefixStore (appliance/kv).

A prompt's cacheable prefix is its longest run of whole blocks that leaves at least one token
to prefill (the logits of the last prompt token are needed to sample). The runner cuts its
prefill at that point whether the cache hits or not, so a run with a restored prefix computes
exactly what a cold run computes.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from functools import lru_cache
from pathlib import Path

import llama_cpp as lc

from ..kv import migrate
from ..kv.ggml_rows import GGML_TYPES
from ..kv import state as kv_state
from ..kv.prefix_store import PrefixStore, block_keys
from ..resources import file_facts

log = logging.getLogger("eie.prefix")

_file_hashes: dict[tuple, str] = {}
_hash_lock = threading.Lock()


def file_sha256(path: Path, cache_dir: Path | None = None) -> str:
    """Content hash of a file, computed once per version of the file (resources/file_facts.py);
    with `cache_dir` also kept on disk, so a restart does not read the whole GGUF again."""
    key = file_facts.stat_key(path)
    with _hash_lock:
        if key in _file_hashes:
            return _file_hashes[key]
    stored = file_facts.load(cache_dir, file_facts.FILE_SHA256, key)
    if isinstance(stored, str) and len(stored) == 64 and all(c in "0123456789abcdef" for c in stored):
        digest = stored
    else:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        digest = h.hexdigest()
        file_facts.save(cache_dir, file_facts.FILE_SHA256, key, digest)
    with _hash_lock:
        _file_hashes[key] = digest
    return digest


@lru_cache(maxsize=1)
def build_id() -> str:
    """The llama.cpp build in use: a hash of its libraries' bytes."""
    lib = Path(lc.__file__).parent / "lib"
    h = hashlib.sha256()
    for name in sorted(p.name for p in lib.glob("lib*.so*") if not p.is_symlink()):
        h.update(name.encode())
        h.update((lib / name).read_bytes())
    return h.hexdigest()


def model_identity(path: Path, type_k: str, type_v: str, k_centers: str = "none",
                   cache_dir: Path | None = None, window: bool = False, layout: str = "") -> bytes:
    """What a saved state depends on: the GGUF content, the KV types, the llama.cpp build, the
    digest of the K centring vector (engine/k_centering.py), whether sliding-window layers keep
    only their window (such a state holds fewer cells there, and a full-size one may not fit) and
    the context's `layout` (context_layout: a state of more cells than a sequence holds, or with V
    laid out for the other attention path, is refused by llama.cpp)."""
    material = f"{file_sha256(path, cache_dir)}|{type_k}|{type_v}|{build_id()}|{k_centers}"
    if window:  # appended only here: full-size caches keep the identities they had
        material += "|swa-window"
    if layout:
        material += "|" + layout
    material = material.encode()
    return hashlib.blake2b(material, digest_size=16).digest()


def context_layout(cells_per_sequence: int, flash_attn: str) -> str:
    """The part of a context's shape its saved states depend on (model_identity's `layout`)."""
    return f"cells={cells_per_sequence}|fa={flash_attn}"


class PrefixCache:
    """Saves and restores prompt prefixes of one runner's context."""

    def __init__(self, store: PrefixStore, rot: tuple[int, int], n_stream: int, swa_window: int = 0,
                 types: tuple[str, str] = ("f16", "f16"), n_swa: int = 0):
        self.store = store
        self.block = store.block
        self.rot = rot
        self.n_stream = n_stream
        # The context's sliding window when its cache reuses cells that leave it (LoadedModel.swa_window):
        # a longer entry past it cannot be cut back to the blocks that matched.
        self.swa_window = swa_window
        # The model's sliding window (llama_model_n_swa), whatever its cache keeps: llama.cpp's
        # llama_state_seq_get_data leaves out the window layers' cells that fell out of the window
        # of the sequence's last position (llama_kv_cache::state_write), in `full` mode too.
        self.n_swa = n_swa
        self._loaded_types = types
        self._root = store.identity

    def retype(self, type_k: str, type_v: str) -> None:
        """The context's KV types changed (a live migration): from now on keys name states of the
        new types. A state computed with other types restores to other values than a cold prefill
        with these computes, so it must never answer for them; the old types' entries stay, and
        answer again if the types come back. The types the model was loaded with keep the store's
        identity as their root, so the disk tier's entries of a restart still match."""
        if (type_k, type_v) == self._loaded_types:
            self._root = self.store.identity
        else:
            self._root = hashlib.blake2b(self.store.identity + f"|{type_k}|{type_v}".encode(), digest_size=16).digest()

    def keys(self, prompt: list[int], adapters: bytes = b"") -> list[bytes]:
        """Block keys of the cacheable prefix (all but at least the last prompt token)."""
        return self.keys_of(prompt[: len(prompt) - 1], adapters)

    def keys_of(self, tokens: list[int], adapters: bytes = b"") -> list[bytes]:
        """Block keys of `tokens`' whole blocks, for the context's current KV types; `adapters` is
        the identity of the LoRA adapters the states are computed with (engine/adapters.py, b""
        for none), so no state of one set answers for another."""
        root = self._root if not adapters else hashlib.blake2b(self._root + adapters, digest_size=16).digest()
        return block_keys(root, tokens, self.block)

    def restore(self, ctx: lc.llama_context_p, mem, seq_id: int, keys: list[bytes],
                types: tuple[str, str]) -> tuple[int, str | None]:
        """Restore the longest saved prefix into `seq_id`; (tokens restored, tier) — (0, None) on a miss."""
        hit = self.store.lookup(keys)
        if hit is None:
            return 0, None
        n_tokens = hit.n_blocks * self.block
        try:
            parsed = kv_state.parse(hit.state)
            cells = kv_state.cell_count(parsed)
            if cells < n_tokens:
                raise kv_state.StateFormatError("the state holds fewer cells than its key says")
            window = self.n_swa or self.swa_window
            if window and n_tokens < cells > window:  # its window layers lack cells the cut needs
                self.store.stats["window_misses"] += 1
                return 0, None
            # a state of the disk tier may be compressed (kv_cache.disk.compress): expand it to the
            # context's types (convert leaves rows that already have them as they are)
            parsed = kv_state.convert(parsed, GGML_TYPES[types[0]], GGML_TYPES[types[1]],
                                      rot_k=self.rot[0], rot_v=self.rot[1])
            migrate.write_sequence(ctx, seq_id, kv_state.with_streams(parsed, self.n_stream).to_bytes())
        except (kv_state.StateFormatError, migrate.MigrationError, ValueError) as e:
            log.warning("prefix cache: a saved state did not restore (%s); prefilling instead", e)
            lc.llama_memory_seq_rm(mem, seq_id, -1, -1)
            self.store.stats["restore_failures"] += 1
            # it would be refused again, and it stands where this prefix's own state is saved
            self.store.discard(hit.key, f"did not restore: {e}")
            return 0, None
        lc.llama_memory_seq_rm(mem, seq_id, n_tokens, -1)  # a longer entry: keep the matched blocks
        return n_tokens, hit.tier

    def prunes(self, n_tokens: int) -> bool:
        """Whether a state of `n_tokens` cells leaves window-layer cells out (see n_swa)."""
        return bool(self.n_swa) and n_tokens > self.n_swa

    def settle(self, ctx: lc.llama_context_p, mem, seq_id: int, raw: bytes | bytearray | None = None) -> None:
        """Lay the sequence's cells out as a restore of its state lays them out (`raw`: the state
        just read, if any). A restore puts a pruned state's window-layer cells at other cells
        than the prefill left them in, and the attention kernels sum over cells in blocks of cell
        indices (EIE's decode path: chunks of 64, blocks of 32; llama.cpp's tiles of 64), so the
        same keys in other cells give other roundings; a cold run that continues from its own
        restored state computes what a hit computes, bit for bit."""
        if raw is None:
            raw = migrate.read_sequence(ctx, seq_id)
        lc.llama_memory_seq_rm(mem, seq_id, -1, -1)
        migrate.write_sequence(ctx, seq_id, raw)

    def save(self, ctx: lc.llama_context_p, seq_id: int, keys: list[bytes]) -> bytearray | None:
        """Save the sequence's state, which must hold exactly len(keys) blocks of cells; returns
        the state read (None where nothing was read)."""
        if not keys or self.store.contains(keys):
            return None
        try:
            raw = migrate.read_sequence(ctx, seq_id)
            kv_state.with_streams(kv_state.parse(raw), 1)  # checks it: one stream with cells
        except (kv_state.StateFormatError, migrate.MigrationError) as e:
            log.warning("prefix cache: could not save a state: %s", e)
            return None
        # Stored as llama.cpp wrote it, the other streams' empty headers included: a restore lays
        # it out for its own context (with_streams) anyway, and rewriting it here would copy the
        # whole state again on the request's path (up to 8 ms for SmolLM2's 500-token prefix).
        self.store.put(keys, raw)
        return raw
