"""The codec's NEON paths (AArch64: Raspberry Pi and other ARM boxes), checked on this x86 machine.

tests/unit/kv/native/simd_check.c compares the SIMD encoder, decoder and K·Q product with the
scalar ones on generated rows and prints a digest of the scalar results. It is built twice: for
this machine with gcc (scalar vs AVX2), and for AArch64 with Zig's clang (static, with no C
library but the few functions of native/freestanding_aarch64.c: Zig would otherwise build all of
musl first, 80 s on 2 cores), which the Unicorn CPU emulator runs (scalar vs NEON). Both must
find no mismatch, and the two digests must be equal: the ARM build encodes and decodes bit for
bit like the x86 one (and so like the numpy reference, which the other codec tests tie to the x86
build). A decoder that reads one index group out of order fails it (checked by hand)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import aarch64_user  # noqa: E402  (next to this file; pytest puts the directory on sys.path)

ROOT = Path(__file__).resolve().parents[3]
CODEC = ROOT / "native" / "turboquant"
CHECK = Path(__file__).parent / "native" / "simd_check.c"
NO_LIBC = Path(__file__).parent / "native" / "freestanding_aarch64.c"


def musl_headers() -> list[str]:
    """-isystem flags for the musl headers Zig ships (it gives none to a build without a libc),
    in the order Zig itself passes them."""
    import ziglang

    include = Path(ziglang.__file__).parent / "lib" / "libc" / "include"
    dirs = [include / d for d in ("aarch64-linux-musl", "generic-musl", "aarch64-linux-any", "any-linux-any")]
    assert all(d.is_dir() for d in dirs), dirs
    return [flag for d in dirs for flag in ("-isystem", str(d))]


FLAGS = ["-O2", "-ffp-contract=off", f"-I{CODEC}", str(CHECK), str(CODEC / "turboquant.c")]


def digests(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^(turbo\d) digest ([0-9a-f]{16})$", stdout, re.M))


@pytest.fixture(scope="module")
def x86_run(tmp_path_factory) -> str:
    exe = tmp_path_factory.mktemp("simd") / "simd_check"
    subprocess.run(["gcc", *FLAGS, "-o", str(exe), "-lm"], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    return proc.stdout


def test_the_x86_build_agrees_with_itself_with_and_without_avx2(x86_run):
    assert "mismatches 0" in x86_run
    assert set(digests(x86_run)) == {"turbo2", "turbo3", "turbo4"}


def test_the_neon_build_is_bit_exact_with_its_scalar_path_and_with_x86(x86_run, tmp_path):
    exe = tmp_path / "simd_check_aarch64"
    subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-musl", "-static", "-nostdlib",
                    "-fno-math-errno", *musl_headers(), *FLAGS, str(NO_LIBC), "-o", str(exe)], check=True, timeout=600)
    result = aarch64_user.run(exe, timeout_s=300)
    assert not result.instructions_limit_hit, result.stdout[-2000:]
    assert result.exit_code == 0, result.stdout[-2000:]
    assert "simd 1 mismatches 0" in result.stdout  # the NEON paths ran
    assert digests(result.stdout) == digests(x86_run)
