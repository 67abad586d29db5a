#!/usr/bin/env bash
# Fails when a shared library under the given directories has a RUNPATH or RPATH entry that
# does not start with $ORIGIN: such an entry names a directory of the build host (a toolkit, a
# downloaded cuBLAS, the build tree), which on the target is missing or, worse, another library.
# `make release` runs it on llama.cpp's libraries and modules in its bundle (not on the Python
# runtime's: an interpreter built under pyenv names its own lib directory, which only the
# interpreter's build can change). Usage: native/check-runpath.sh DIR...
set -euo pipefail
command -v readelf >/dev/null || { echo "check-runpath: readelf (binutils) is needed" >&2; exit 2; }
for dir in "$@"; do
  [ -d "$dir" ] || { echo "check-runpath: no directory $dir" >&2; exit 2; }
done
bad=0
while IFS= read -r -d '' lib; do
  paths="$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]$/\1/p')"
  [ -n "$paths" ] || continue
  IFS=: read -r -a entries <<<"$paths"
  for entry in "${entries[@]}"; do
    # shellcheck disable=SC2016 # the literal $ORIGIN, which the loader expands
    case "$entry" in
      '$ORIGIN'* | '${ORIGIN}'*) ;;
      *) echo "$lib: RUNPATH entry $entry is a directory of the build host" >&2; bad=1 ;;
    esac
  done
done < <(find "$@" -type f -name '*.so*' -print0)
exit "$bad"
