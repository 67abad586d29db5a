"""Make a draft model for speculative decoding: a copy of a GGUF keeping only its first layers.

The copy has the target's tokenizer (the same vocabulary, so its drafts can be verified by the
target) and its embeddings, output norm and output head, with `<arch>.block_count` set to the
layers kept: a layer-skipping self-draft. No weights are downloaded or trained; on this machine
it takes a few seconds (the `gguf` package parses the whole tokenizer: about 3 s for SmolLM2,
12 s for Gemma 3's 262k tokens) and writes about (embeddings + kept layers) bytes.

    python -m appliance.engine.speculative.make_draft SRC.gguf DST.gguf --layers 4
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import gguf

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def truncate_layers(src: Path, dst: Path, layers: int) -> int:
    """Write `dst`: `src` with only its first `layers` transformer blocks; returns the bytes written."""
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    total = int(reader.fields[f"{arch}.block_count"].contents())
    if not 1 <= layers <= total:
        raise ValueError(f"layers must be between 1 and {total} for {src.name}, got {layers}")
    tmp = dst.with_name(dst.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch, endianess=reader.endianess)
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        value = layers if name == f"{arch}.block_count" else f.contents()
        if name == "general.name":
            value = f"{value} (first {layers} of {total} layers)"
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(name, value, f.types[0], sub_type=sub)
    kept = [t for t in reader.tensors if not ((m := _BLOCK.match(t.name)) and int(m.group(1)) >= layers)]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data)
    writer.close()
    os.replace(tmp, dst)
    return dst.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--layers", type=int, required=True, help="transformer blocks to keep (from the first)")
    args = ap.parse_args(argv)
    size = truncate_layers(args.src, args.dst, args.layers)
    print(f"{args.dst}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
