#!/usr/bin/env bash
# CMake flags of the release build (`make release`, the images): ggml backends as modules, every
# CPU variant (the best one for the machine is chosen at start-up), and the GPU modules.
# EIE_GPU: cuda | rocm | none | auto (default: cuda when nvcc is found, rocm when hipcc is).
set -euo pipefail
args="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
args="$args -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF"
gpu="${EIE_GPU:-auto}"
if [ "$gpu" = auto ]; then
  if command -v nvcc >/dev/null 2>&1; then gpu=cuda
  elif command -v hipcc >/dev/null 2>&1 || [ -x /opt/rocm/bin/hipcc ]; then gpu=rocm
  else gpu=none; fi
fi
case "$gpu" in
  cuda) args="$args -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-75;80;86;89;90}" ;;
  rocm) args="$args -DGGML_HIP=ON -DAMDGPU_TARGETS=${AMDGPU_TARGETS:-gfx1100;gfx1030;gfx90a;gfx942}" ;;
  none) ;;
  *) echo "EIE_GPU must be cuda, rocm, none or auto, not $gpu" >&2; exit 2 ;;
esac
echo "$args"
