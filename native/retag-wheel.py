"""Copies a wheel under another platform tag: the file name, the Tag lines of its WHEEL file and
that file's RECORD entry change, nothing else. For a wheel whose native libraries were
cross-compiled for that platform (native/build-llama-wheel.sh with EIE_CROSS_AARCH64=1).

Usage: python native/retag-wheel.py WHEEL PLATFORM OUT_DIR   (prints the new wheel's path)"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def retag(wheel: Path, platform: str, out_dir: Path) -> Path:
    parts = wheel.name.removesuffix(".whl").split("-")
    if len(parts) != 5:
        raise SystemExit(f"{wheel.name}: expected name-version-python-abi-platform.whl")
    name, version, python, abi, _ = parts
    target = out_dir / f"{name}-{version}-{python}-{abi}-{platform}.whl"
    with zipfile.ZipFile(wheel) as src:
        infos = src.infolist()
        data = {info.filename: src.read(info) for info in infos}
    wheel_file = next(n for n in data if n.endswith(".dist-info/WHEEL"))
    record_file = next(n for n in data if n.endswith(".dist-info/RECORD"))
    data[wheel_file] = b"".join(
        f"Tag: {python}-{abi}-{platform}\n".encode() if line.startswith(b"Tag: ") else line
        for line in data[wheel_file].splitlines(keepends=True))
    data[record_file] = "".join(
        _record_line(wheel_file, data[wheel_file]) + "\n" if line.split(",", 1)[0] == wheel_file else line
        for line in data[record_file].decode().splitlines(keepends=True)).encode()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for info in infos:
            out.writestr(info, data[info.filename], compress_type=zipfile.ZIP_DEFLATED)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    print(retag(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])))
