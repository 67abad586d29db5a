#!/usr/bin/env bash
# The CUDA check of the release build, for a host with an NVIDIA GPU and nvcc but no package index
# (how it ran: README "GPU check"). Two phases, so each fits a short session on a lent machine:
#   bench/cuda_check.sh build   builds the release wheel (native/release-cmake-args.sh, EIE_GPU=cuda)
#                               from a local sdist and installs it with EIE into PYTHON's environment
#   bench/cuda_check.sh serve   `eie doctor`, then bench/cuda_serve.py: `eie serve` of SmolLM2
#                               offloaded to the GPU (health time, a chat completion, decode speed,
#                               memory status, metrics, GPU memory against the estimate at several
#                               layer counts, and where PyInstaller is installed the frozen binary
#                               from `env -i`), then tests/integration/test_graph_keep.py (patch 0008
#                               keeps one graph beside a GPU, whole or split)
# Inputs (env): SDIST (llama-cpp-python sdist), WHEELS (dir of EIE's dependency wheels missing on the
# host), MODEL_DIR (holds SmolLM2-135M-Instruct.Q4_1.gguf), CUDA_ARCHITECTURES (default 90),
# RESULTS (where the reports go, default bench/results/cuda), PYTHON (the interpreter whose environment
# gets EIE, default python3: a lent machine starts bare, so its own environment is used as is).
#   bench/cuda_check.sh pack    (here, with an index) what a bare host needs, under .dev/ (ignored):
#                               .dev/a: a trimmed sdist and the first half of SmolLM2, .dev/b: the
#                               second half, .dev/wheels: EIE's dependencies for the host's Python
#                               (HOST_PY, default 3.12), each part under the 64 MiB a call carries
# On a lent machine (the device tool: 10 minutes a command, 30 s warm between calls), e.g.:
#   call 1, carry [.dev/a, .dev/wheels]: mkdir -p /tmp/m /tmp/cr; cp .dev/a/* /tmp/m/;
#     setsid nohup env SDIST=/tmp/m/llama-src.tar.xz WHEELS=$PWD/.dev/wheels RESULTS=/tmp/cr \
#       bash -c 'bench/cuda_check.sh build > /tmp/cr/out 2>&1; echo $? > /tmp/cr/rc' &  (returns at once)
#   call 2 at once, carry [.dev/b]: cat /tmp/m/smol.a .dev/b/smol.b > /tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf;
#     wait for /tmp/cr/rc; MODEL_DIR=/tmp/m RESULTS=/tmp/sr bench/cuda_check.sh serve; tar czf $OUT/r.tgz /tmp/cr /tmp/sr
set -euo pipefail
phase="${1:?usage: bench/cuda_check.sh pack|build|serve}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
results="${RESULTS:-$repo/bench/results/cuda}"
py="${PYTHON:-python3}"
model_dir="${MODEL_DIR:-$repo/models}"
mkdir -p "$results"
cd "$repo"
export PATH="$PATH:/usr/local/cuda/bin"

pack() {
  local version=0.3.36 tmp half model="models/SmolLM2-135M-Instruct.Q4_1.gguf"
  tmp="$(mktemp -d)"
  mkdir -p .dev/a .dev/b .dev/wheels
  python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version"
  tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  # what the wheel build does not read: vocab files, docs, tools other than mtmd, git objects
  (cd "$tmp"/llama_cpp_python-$version/vendor/llama.cpp &&
    rm -rf models docs media benches .github examples pocs conversion gguf-py .devops .git tools/mtmd/*.mp4 &&
    find tools -mindepth 1 -maxdepth 1 ! -name mtmd -exec rm -rf {} +)
  rm -rf "$tmp"/llama_cpp_python-$version/.git
  tar cJf .dev/a/llama-src.tar.xz -C "$tmp" "llama_cpp_python-$version"
  rm -rf "$tmp"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${HOST_PY:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .dev/wheels msgspec httptools uvicorn gguf diskcache pytest iniconfig pluggy packaging \
    pyinstaller pyinstaller-hooks-contrib altgraph setuptools
  half=$(( $(stat -c %s "$model") / 2 ))
  head -c "$half" "$model" > .dev/a/smol.a
  tail -c +"$(( half + 1 ))" "$model" > .dev/b/smol.b
  du -sh .dev/a .dev/b .dev/wheels
}

build() {
  command -v patch > /dev/null || command -v git > /dev/null \
    || { echo "patch(1) or git is needed (native/prepare-llama-source.sh)" >&2; exit 1; }
  trap 'tail -n 40 "$results/build.log" >&2' ERR
  if [ -n "${WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl
  fi
  local t0 args wheel
  t0=$(date +%s)
  # the lent H200's CC/CXX (/opt/gcc/bin) wrap Ubuntu's gcc 13 and link libstdc++ statically, which
  # build-llama-wheel.sh refuses: take the distribution's compilers where they are
  if [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
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

# The CUDA module needs the host's CUDA runtime and cuBLAS. Where the loader does not know them,
# take the toolkit's lib64 and the NVIDIA wheels in PYTHON's environment (a PyTorch host's).
host_cuda_libs() {
  ldconfig -p | grep -q 'libcublas\.so' && return 0
  local dirs d
  dirs="$("$py" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null \
    | while read -r d; do ls -d "$d"/nvidia/*/lib 2>/dev/null; done | tr '\n' ':')"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && dirs="$dirs$d:"
  done
  export LD_LIBRARY_PATH="${dirs%:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$results/host-libs.txt"
}

serve() {
  export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
  host_cuda_libs
  "$py" -m appliance doctor > "$results/doctor.txt" 2>&1 || true
  "$py" -m appliance doctor --json > "$results/doctor.json" 2> /dev/null || true
  local frozen=()
  if "$py" -c 'import PyInstaller' 2> /dev/null && "$py" -m PyInstaller --noconfirm --log-level WARN \
      --distpath /tmp/eie-frozen/dist --workpath /tmp/eie-frozen/work build.spec > "$results/freeze.log" 2>&1; then
    frozen=(--frozen /tmp/eie-frozen/dist/eie/eie)
  fi
  "$py" bench/cuda_serve.py --model-dir "$model_dir" --results "$results" "${frozen[@]}"
  # patch 0008 beside a GPU: the last graph alone, whole on the GPU and split with the CPU
  mkdir -p models && ln -sf "$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf" models/ 2> /dev/null || true
  "$py" -m pytest -q -p no:cacheprovider tests/integration/test_graph_keep.py -k "smollm2 or split" \
    > "$results/graph_keep.txt" 2>&1 || true
  nvidia-smi > "$results/nvidia-smi.txt" 2>&1 || true
}

"$phase"
