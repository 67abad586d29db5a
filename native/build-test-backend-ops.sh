#!/usr/bin/env bash
# Builds llama.cpp's own op test (tests/test-backend-ops.cpp, with the TurboQuant cases the
# patch adds) against the ggml libraries of the installed llama-cpp-python wheel.
# Usage: native/build-test-backend-ops.sh WHEEL_CACHE_DIR PYTHON OUTPUT
set -euo pipefail
cache="$1"
python="$2"
out="$3"
lib="$("$python" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')"
src="$cache/test-backend-ops"
if [ ! -f "$src/test-backend-ops.cpp" ] || [ ! -d "$cache/ggml/include" ]; then
  echo "no test-backend-ops sources next to the wheel in $cache (rebuild the wheel)" >&2
  exit 1
fi
echo "building test-backend-ops against $lib" >&2
g++ -std=c++17 -O1 -pthread -I"$cache/ggml/include" "$src/test-backend-ops.cpp" -o "$out.tmp" \
  -L"$lib" -lggml -lggml-base -Wl,-rpath,"$lib"
mv "$out.tmp" "$out"
# ggml backends are loadable modules (GGML_BACKEND_DL): test-backend-ops loads them from its own
# directory, so link the build's modules there.
for module in "$lib"/libggml-*.so "$lib"/../../bin/libggml-*.so; do
  case "$(basename "$module")" in libggml-base.so) continue ;; esac
  [ -f "$module" ] && ln -sf "$(cd "$(dirname "$module")" && pwd)/$(basename "$module")" "$(dirname "$out")/"
done
true
