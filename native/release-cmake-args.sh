#!/usr/bin/env bash
# CMake flags of the release build (`make release`, the images): ggml backends as modules, every
# CPU variant (the best one for the machine is chosen at start-up), and the GPU modules.
# EIE_GPU: cuda | rocm | none | auto (default: cuda where nvcc and cuBLAS's headers are found,
# rocm where hipcc is, else none). A CUDA toolkit without cuBLAS (nvcc alone, as on some build
# hosts) cannot build ggml's CUDA module by itself: auto leaves CUDA out there and says so on
# stderr; EIE_GPU=cuda takes cuBLAS from NVIDIA's wheel on PyPI instead (native/cuda-pypi-deps.sh,
# about 450 MB, downloaded once).
set -euo pipefail
args="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
args="$args -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF"

# The first directory holding include/<header>, where CMake's FindCUDAToolkit looks: CUDA_PATH,
# CUDAToolkit_ROOT, /usr/local/cuda, the system (/usr), and the toolkit nvcc belongs to (nvcc
# may be a wrapper script elsewhere, hence the others).
cuda_dir_with() {
  local dirs=("${CUDA_PATH:-}" "${CUDAToolkit_ROOT:-}" /usr/local/cuda /usr)
  local nvcc
  nvcc="$(command -v nvcc 2>/dev/null || true)"
  [ -n "$nvcc" ] && dirs+=("$(dirname "$(dirname "$(readlink -f "$nvcc")")")")
  local d
  for d in "${dirs[@]}"; do
    [ -n "$d" ] && [ -f "$d/include/$1" ] && { echo "$d"; return 0; }
  done
  return 1
}

gpu="${EIE_GPU:-auto}"
if [ "$gpu" = auto ]; then
  if command -v nvcc >/dev/null 2>&1 && cuda_dir_with cublas_v2.h >/dev/null; then gpu=cuda
  elif command -v hipcc >/dev/null 2>&1 || [ -x /opt/rocm/bin/hipcc ]; then gpu=rocm
  else
    command -v nvcc >/dev/null 2>&1 && echo "release-cmake-args: nvcc found but not cuBLAS (cublas_v2.h): building without CUDA (EIE_GPU=cuda takes cuBLAS from PyPI)" >&2
    gpu=none
  fi
fi
case "$gpu" in
  cuda)
    args="$args -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-75;80;86;89;90}"
    if ! cuda_dir_with cublas_v2.h >/dev/null; then
      nvcc="$(command -v nvcc 2>/dev/null)" || { echo "EIE_GPU=cuda needs nvcc; none found" >&2; exit 2; }
      major="$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
      root="$(cuda_dir_with cuda.h)" || { echo "EIE_GPU=cuda: no CUDA toolkit (include/cuda.h) found beside nvcc" >&2; exit 2; }
      deps="$("$(dirname "$0")/cuda-pypi-deps.sh" "$root" "$major")"
      args="$args $deps"
    fi ;;
  rocm) args="$args -DGGML_HIP=ON -DAMDGPU_TARGETS=${AMDGPU_TARGETS:-gfx1100;gfx1030;gfx90a;gfx942}" ;;
  none) ;;
  *) echo "EIE_GPU must be cuda, rocm, none or auto, not $gpu" >&2; exit 2 ;;
esac
echo "$args"
