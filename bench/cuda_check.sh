#!/usr/bin/env bash
# The CUDA check of the release build, for a host with an NVIDIA GPU and nvcc but no package index
# (how it ran: README "GPU check"). Two phases, so each fits a short session on a lent machine:
#   bench/cuda_check.sh build   builds the release wheel (native/release-cmake-args.sh, EIE_GPU=cuda)
#                               from a local sdist and installs it with EIE into PYTHON's environment
#   bench/cuda_check.sh serve   `eie doctor`, then bench/cuda_serve.py: `eie serve` of SmolLM2
#                               offloaded to the GPU (health time, a chat completion, decode speed,
#                               memory status, metrics)
# Inputs (env): SDIST (llama-cpp-python sdist), WHEELS (dir of EIE's dependency wheels missing on the
# host), MODEL_DIR (holds SmolLM2-135M-Instruct.Q4_1.gguf), CUDA_ARCHITECTURES (default 90),
# RESULTS (where the reports go, default bench/results/cuda), PYTHON (the interpreter whose environment
# gets EIE, default python3: a lent machine starts bare, so its own environment is used as is).
set -euo pipefail
phase="${1:?usage: bench/cuda_check.sh build|serve}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
results="${RESULTS:-$repo/bench/results/cuda}"
py="${PYTHON:-python3}"
model_dir="${MODEL_DIR:-$repo/models}"
mkdir -p "$results"
cd "$repo"
export PATH="$PATH:/usr/local/cuda/bin"

build() {
  command -v patch > /dev/null || { echo "patch(1) is needed (native/prepare-llama-source.sh)" >&2; exit 1; }
  trap 'tail -n 40 "$results/build.log" >&2' ERR
  if [ -n "${WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl
  fi
  local t0 args wheel
  t0=$(date +%s)
  args="$(EIE_GPU=cuda CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" native/release-cmake-args.sh)"
  wheel="$(EIE_CMAKE_ARGS="$args" LLAMA_CPP_PYTHON_SDIST="${SDIST:-}" EIE_PIP_WHEEL_ARGS=--no-build-isolation \
    EIE_WHEEL_CACHE=/tmp/eie-wheels PYTHON="$py" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    native/build-llama-wheel.sh 2> "$results/build.log" | tail -n1)"
  echo "wheel built in $(( $(date +%s) - t0 )) s with $(nproc) jobs: CMAKE_ARGS=$args" | tee "$results/build-summary.txt"
  "$py" -m pip install -q --no-index --no-deps "$wheel"
  "$py" -m pip install -q --no-index --no-deps --no-build-isolation -e "$repo" \
    || echo "no editable install of EIE (serve runs it from the checkout)" >&2
  python3 -m zipfile -l "$wheel" | grep -E '\.so' >> "$results/build-summary.txt"
}

serve() {
  export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -m appliance doctor > "$results/doctor.txt" 2>&1 || true
  "$py" -m appliance doctor --json > "$results/doctor.json" 2> /dev/null || true
  "$py" bench/cuda_serve.py --model-dir "$model_dir" --results "$results"
  nvidia-smi > "$results/nvidia-smi.txt" 2>&1 || true
}

"$phase"
