#!/usr/bin/env bash
# Builds the llama-cpp-python wheel from source once per (version, CMake flags, patches)
# and caches it, so a second setup on the same machine installs in seconds.
# Prints the path of the cached wheel on its last line. Next to the wheel it keeps the prepared
# ggml tree and tests/test-backend-ops.cpp (see native/build-test-backend-ops.sh).
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
python="${PYTHON:-python3.11}"
here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${EIE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eie/wheels}"
# Every build loads its ggml backends as modules (GGML_BACKEND_DL, see appliance/engine/backends.py).
# On x86 ggml refuses GGML_NATIVE with it: the setup build names this CPU's features instead,
# which gives the one CPU module -march=native would (the release build: native/release-cmake-args.sh).
host_cpu_args() {
  [ "$(uname -m)" = x86_64 ] || return 0
  local flags out pair v
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  out="-DGGML_NATIVE=OFF"
  for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C avx_vnni:AVX_VNNI \
              avx512f+avx512cd+avx512vl+avx512dq+avx512bw:AVX512 avx512vbmi:AVX512_VBMI \
              avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 \
              amx_tile:AMX_TILE amx_int8:AMX_INT8 amx_bf16:AMX_BF16; do
    v=ON
    for f in $(echo "${pair%%:*}" | tr + ' '); do
      case "$flags" in *" $f "*) ;; *) v=OFF ;; esac
    done
    out="$out -DGGML_${pair#*:}=$v"
  done
  echo "$out"
}
# EIE_CROSS_AARCH64=1 (with EIE_CMAKE_ARGS): compiles llama.cpp for arm64 with Debian's
# aarch64-linux-gnu cross compiler and caches the wheel where an arm64 host with this Python
# version looks for it (images/pi-gen/build-arm64-release.sh). llama-cpp-python's Python code
# is the same on every machine, so only the wheel's platform tag changes (native/retag-wheel.py).
arch="$(uname -m)"
cross_args=""
if [ "${EIE_CROSS_AARCH64:-}" = 1 ]; then
  [ -n "${EIE_CMAKE_ARGS:-}" ] || { echo "EIE_CROSS_AARCH64 needs EIE_CMAKE_ARGS (the target's flags)" >&2; exit 2; }
  arch=aarch64
  cross_args="-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64"
  cross_args="$cross_args -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++"
  cross_args="$cross_args -DCMAKE_FIND_ROOT_PATH=/usr/aarch64-linux-gnu -DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER"
  cross_args="$cross_args -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY"
fi
cmake_args="${EIE_CMAKE_ARGS:--DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_BACKEND_DL=ON $(host_cpu_args)}"

key_material="$version|$cmake_args|$arch|$("$python" -c 'import sys; print(sys.version_info[:2])')"
key_material="$key_material|$(cat "$here"/prepare-llama-source.sh "$here"/patches/*.patch "$here"/turboquant/*.[ch] 2>/dev/null | sha256sum | cut -c1-16)"
key="$(printf '%s' "$key_material" | sha256sum | cut -c1-16)"
dest="$cache_root/$key"

if ls "$dest"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "cached llama-cpp-python wheel: $dest" >&2
  ls "$dest"/llama_cpp_python-*.whl | head -n1
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# LLAMA_CPP_PYTHON_SDIST: a local copy of the sdist (any tar compression), for hosts without an index.
if [ -n "${LLAMA_CPP_PYTHON_SDIST:-}" ]; then
  tar xf "$LLAMA_CPP_PYTHON_SDIST" -C "$work"
else
  "$python" -m pip download --no-deps --no-binary :all: -d "$work/sdist" "llama-cpp-python==$version" >&2
  tar xzf "$work"/sdist/llama_cpp_python-*.tar.gz -C "$work"
fi
src="$(echo "$work"/llama_cpp_python-*/)"
"$here/prepare-llama-source.sh" "$src/vendor/llama.cpp" >&2

export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export CMAKE_ARGS="$cmake_args${cross_args:+ $cross_args}"
echo "building llama-cpp-python $version (CMAKE_ARGS=$CMAKE_ARGS, $CMAKE_BUILD_PARALLEL_LEVEL jobs)" >&2
# EIE_PIP_WHEEL_ARGS: e.g. --no-build-isolation where the build backend is installed and no index is.
# shellcheck disable=SC2086
"$python" -m pip wheel --no-deps ${EIE_PIP_WHEEL_ARGS:-} -w "$work/wheel" "$src" >&2
# libllama must load libstdc++ as a shared library. A toolchain that links it statically (the
# lent H200's CXX, a wrapper of Ubuntu's g++ 13, did) gives libllama, libggml and every backend
# module their own copy, each exporting its symbols; they interpose on each other, and llama.cpp
# crashed in std::regex (the tokenizer) at the first model load.
built="$(ls "$work"/wheel/llama_cpp_python-*.whl)"
"$python" - "$built" "$work/libllama.so" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("llama_cpp/lib/libllama.so"))
    open(sys.argv[2], "wb").write(z.read(name))
PY
if command -v readelf > /dev/null && ! readelf -d "$work/libllama.so" | grep -q 'NEEDED.*libstdc++'; then
  echo "build-llama-wheel: libllama.so does not link libstdc++.so as a shared library: the C++ compiler" \
    "(CXX=${CXX:-c++}) links it statically, and the libraries would crash; build with one that does not" \
    "(e.g. CXX=/usr/bin/g++ CC=/usr/bin/gcc)" >&2
  exit 3
fi
mkdir -p "$dest.tmp"
if [ -n "$cross_args" ]; then
  "$python" "$here/retag-wheel.py" "$work"/wheel/llama_cpp_python-*.whl linux_aarch64 "$dest.tmp" >&2
else
  cp "$work"/wheel/llama_cpp_python-*.whl "$dest.tmp/"
fi
# The prepared ggml tree: its headers build llama.cpp's op tests against this wheel
# (native/build-test-backend-ops.sh), and tests configure it to see what a release build gets.
cp -r "$src/vendor/llama.cpp/ggml" "$dest.tmp/ggml"
mkdir -p "$dest.tmp/test-backend-ops"
cp "$src/vendor/llama.cpp/tests/test-backend-ops.cpp" "$dest.tmp/test-backend-ops/"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
ls "$dest"/llama_cpp_python-*.whl | head -n1
