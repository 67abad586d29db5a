"""A model's context replaced by one with other KV types, its live sequences' states converted
into the new one (kv/migrate.py), the weights untouched.

Direct (migrate.DIRECT): the new context is made first and the states go straight across, then
the old one is freed. Staged: the states are converted into host memory, the old context is
freed, then the new one is made and they are written in, so the memory peak is the larger
context plus the live states, where the direct way holds both contexts (when memory is short,
which is when the KV steps down). Anything that fails before the old context is freed changes
nothing; after it, a context of the old types comes back with the states (`MigrationReverted`),
and where even that cannot be made the context is lost (`ContextLost`).
"""

from __future__ import annotations

from typing import Callable

import llama_cpp as lc

from ..kv import migrate
from ..resources import heap
from ..resources.kv_choice import kv_label
from . import native


class MigrationReverted(RuntimeError):
    """The new context could not be made; the model is back on its old types, its sequences in."""


class ContextLost(RuntimeError):
    """Neither the new context nor one of the old types could be made: the model has none."""


def change_kv_types(loaded: native.LoadedModel, live: list[int], type_k: str, type_v: str,
                    on_sequence: Callable[[int, int, int], None]) -> None:
    """Give `loaded` a context of `type_k`/`type_v` holding the `live` sequences' states
    (`on_sequence(seq, bytes before, bytes after)` for each). Raises with the old context in
    place, MigrationReverted with an old-typed one in its place, or ContextLost."""
    rot = migrate.rotation_sizes(loaded.metadata)
    if migrate.DIRECT:
        ctx, buffers = native.new_context(loaded, type_k, type_v)
        try:
            migrate.migrate(loaded.ctx, ctx, live, type_k=type_k, type_v=type_v, rot=rot, on_sequence=on_sequence)
        except BaseException:
            lc.llama_free(ctx)
            raise
        loaded.swap_context(ctx, buffers, type_k, type_v)
        return
    native.check_kv_types(type_k, type_v)
    old_k, old_v = loaded.type_k, loaded.type_v
    staged = migrate.stage(loaded.ctx, live, type_k=type_k, type_v=type_v, rot=rot, on_sequence=on_sequence)
    loaded.drop_context()
    try:
        ctx, buffers = native.new_context(loaded, type_k, type_v)
        try:
            migrate.unstage(ctx, staged)
        except BaseException:
            lc.llama_free(ctx)
            raise
    except Exception as e:
        _reinstate(loaded, staged, old_k, old_v, rot, f"{kv_label(type_k, type_v)}: {e}")
    loaded.install_context(ctx, buffers, type_k, type_v)
    del staged
    heap.trim()  # the states, now in the context, go back to the system


def _reinstate(loaded: native.LoadedModel, staged: list[tuple[int, bytes]], type_k: str, type_v: str,
               rot: tuple[int, int], why: str) -> None:
    """Put a context of the old types back after the new one could not be made; the live states
    go back converted (they went through the other types). Always raises."""
    try:
        ctx, buffers = native.new_context(loaded, type_k, type_v)
    except Exception as e:
        raise ContextLost(f"KV change to {why}; the old types could not come back either: {e}") from None
    try:
        migrate.unstage(ctx, [(seq_id, migrate.convert_bytes(data, type_k, type_v, rot)) for seq_id, data in staged])
    except Exception as e:
        lc.llama_free(ctx)
        raise ContextLost(f"KV change to {why}; the sequences could not go back into "
                          f"{kv_label(type_k, type_v)}: {e}") from None
    loaded.install_context(ctx, buffers, type_k, type_v)
    raise MigrationReverted(f"no context with {why}; the model is back on {kv_label(type_k, type_v)} "
                            f"with its {len(staged)} live sequence(s)")
