#!/usr/bin/env bash
# Prepares a vendored llama.cpp tree for EIE's builds (the llama-cpp-python wheel and the
# llama-server used by the benches): applies native/patches/*.patch and copies the TurboQuant
# codec (native/turboquant/) into ggml, where the patch builds it into ggml-base.
# Usage: native/prepare-llama-source.sh PATH/TO/llama.cpp
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="$1"
for p in "$here"/patches/*.patch; do
  [ -e "$p" ] || continue
  echo "applying $(basename "$p")" >&2
  if command -v patch > /dev/null; then
    patch -d "$dest" -p1 --forward --quiet < "$p"
  else  # a host without patch(1), as some CUDA images: git applies a plain diff outside a repository too
    git -C "$dest" apply -p1 --whitespace=nowarn "$p"
  fi
done
cp "$here"/turboquant/turboquant.c "$here"/turboquant/turboquant.h "$here"/turboquant/turboquant_codebooks.h \
  "$dest/ggml/src/"
