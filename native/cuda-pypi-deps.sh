#!/usr/bin/env bash
# What ggml's CUDA module links and a bare toolkit (nvcc and the runtime, as on some build hosts)
# lacks: cuBLAS, from NVIDIA's redistributable wheel on PyPI (nvidia-cublas for CUDA 13,
# nvidia-cublas-cu12 for 12), unpacked once into a cache; and, where the toolkit has no
# lib64/stubs/libcuda.so, a link stub for the driver library, as NVIDIA's: every CUresult function
# cuda.h declares, empty, soname libcuda.so.1, so the module records libcuda.so.1 as needed (a stub
# without the symbols is dropped by --as-needed, and the module then fails to load on a GPU host
# with its driver calls unresolved). Prints the CMake flags that point the build at them.
# Usage: native/cuda-pypi-deps.sh TOOLKIT_DIR CUDA_MAJOR
#   EIE_CUDA_DEPS_DIR: the cache (default ~/.cache/eie/cuda-deps); PYTHON: the pip to download with.
set -euo pipefail
toolkit="$1"
major="$2"
case "$major" in
  12) package=nvidia-cublas-cu12 ;;
  13) package=nvidia-cublas ;;
  *) echo "cuda-pypi-deps: no cuBLAS wheel known for CUDA $major (12 or 13)" >&2; exit 2 ;;
esac
cache="${EIE_CUDA_DEPS_DIR:-$HOME/.cache/eie/cuda-deps}/cu$major"
dest="$cache"
# A host without a package index may already hold the wheel in PYTHON's environment (PyTorch's
# CUDA builds install it): nvidia/cublas/ (CUDA 12) or nvidia/cu13/ (CUDA 13).
if [ ! -f "$dest/include/cublas_v2.h" ]; then
  installed="$("${PYTHON:-python3}" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null \
    | while read -r d; do ls "$d"/nvidia/*/include/cublas_v2.h 2>/dev/null; done | head -n1 || true)"
  root="$(dirname "$(dirname "${installed:-/none/include/x}")")"
  if [ -f "$root/lib/libcublas.so.$major" ]; then
    dest="$root"
    echo "cuda-pypi-deps: cuBLAS from the installed wheel at $dest" >&2
  fi
fi
if [ ! -f "$dest/include/cublas_v2.h" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  if ! "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary :all: -d "$work" "$package==$major.*" >&2; then
    echo "cuda-pypi-deps: cuBLAS is not beside nvcc and $package could not be downloaded from the package index" >&2
    exit 2
  fi
  "${PYTHON:-python3}" -m zipfile -e "$work"/*.whl "$work/wheel"
  header="$(find "$work/wheel" -path '*/include/cublas_v2.h' | head -n1)"
  [ -n "$header" ] || { echo "cuda-pypi-deps: $package holds no cublas_v2.h" >&2; exit 2; }
  root="$(dirname "$(dirname "$header")")"
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  cp -r "$root/include" "$root/lib" "$dest.tmp/"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
fi
flags="-DCUDA_cublas_LIBRARY=$dest/lib/libcublas.so.$major -DCUDA_cublasLt_LIBRARY=$dest/lib/libcublasLt.so.$major"
flags="$flags -DCMAKE_CUDA_FLAGS=-I$dest/include"
if [ ! -f "$toolkit/lib64/stubs/libcuda.so" ]; then
  if [ ! -f "$cache/stubs/libcuda.so" ]; then
    mkdir -p "$cache/stubs"
    names="$(echo '#include <cuda.h>' | "${CC:-cc}" -E -I"$toolkit/include" -x c - \
      | grep -oE 'CUresult[[:space:]]+cu[A-Za-z0-9_]+[[:space:]]*\(' | grep -oE 'cu[A-Za-z0-9_]+' | sort -u)"
    [ -n "$names" ] || { echo "cuda-pypi-deps: no driver functions found in $toolkit/include/cuda.h" >&2; exit 2; }
    for name in $names; do echo "int $name(void) { return 0; }"; done \
      | "${CC:-cc}" -shared -fPIC -x c - -Wl,-soname,libcuda.so.1 -o "$cache/stubs/libcuda.so"
  fi
  flags="$flags -DCUDA_cuda_driver_LIBRARY=$cache/stubs/libcuda.so"
fi
echo "$flags"
