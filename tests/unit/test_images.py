"""images/ and the shell scripts: hadolint on every Containerfile (settings in .hadolint.yaml),
shellcheck on every script, and every COPY source and preset they name exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

CONTAINERFILES = sorted((ROOT / "images").glob("Containerfile.*"))
SCRIPTS = sorted(p for p in ROOT.rglob("*.sh") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
                 and "build" not in p.relative_to(ROOT).parts[:1])
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} missing: `make setup` installs it (test extras)"
    return path


def test_there_are_cpu_cuda_and_rocm_images():
    assert {p.suffix for p in CONTAINERFILES} == {".cpu", ".cuda", ".rocm"}


@pytest.mark.parametrize("path", CONTAINERFILES, ids=lambda p: p.name)
def test_hadolint(path):
    out = subprocess.run([_tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", CONTAINERFILES, ids=lambda p: p.name)
def test_copy_sources_exist(path):
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*(COPY|ADD)\s+(.*)$", line)
        if not m or "--from=" in line:
            continue
        args = [a for a in m.group(2).split() if not a.startswith("--")]
        for src in args[:-1]:
            assert src == "." or (ROOT / src).exists(), f"{path.name}: COPY source {src} missing"
    assert "make release" in path.read_text()


@pytest.mark.parametrize("path", CONTAINERFILES, ids=lambda p: p.name)
def test_build_stage_has_what_pyinstaller_needs(path):
    """PyInstaller freezes against the shared libpython, which Debian and Ubuntu ship apart from
    the interpreter; without it `make release` stops at the freeze (found by building the CPU
    image, images/smoke-test.sh)."""
    build_stage = path.read_text().split("make release")[0]
    assert re.search(r"\blibpython3\.11\b", build_stage), f"{path.name}: the build stage must install libpython3.11"


def test_shellcheck():
    assert SCRIPTS, "no scripts found"
    out = subprocess.run([_tool("shellcheck"), "--severity=warning", *map(str, SCRIPTS)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_pi_stage_installs_the_unit_and_the_pi_preset():
    run = (ROOT / "images/pi-gen/stage-eie/00-install-eie/00-run.sh").read_text()
    assert "systemctl enable eie.service" in run and "ROOTFS_DIR" in run
    prepare = (ROOT / "images/pi-gen/prepare.sh").read_text()
    assert "presets/raspberry-pi.yaml" in prepare and (ROOT / "presets/raspberry-pi.yaml").is_file()
