#!/bin/sh
# Fills stage-eie/00-install-eie/files/ from an arm64 release build and the models directory.
# Usage: images/pi-gen/prepare.sh DIST_DIR MODELS_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dist=${1:?usage: prepare.sh DIST_DIR MODELS_DIR}
models=${2:?usage: prepare.sh DIST_DIR MODELS_DIR}
files="$here/stage-eie/00-install-eie/files"
[ -x "$dist/eie" ] || { echo "prepare.sh: no executable $dist/eie" >&2; exit 1; }
rm -rf "$files/eie" "$files/models"
mkdir -p "$files"
cp -a "$dist" "$files/eie"
cp -a "$models" "$files/models"
cp "$root/systemd/eie.service" "$root/systemd/eie.sysusers.conf" "$root/systemd/eie.env" "$files/"
sed 's#^model_dir:.*#model_dir: /opt/eie/models#' "$root/presets/raspberry-pi.yaml" > "$files/eie.yaml"
echo "stage files ready in $files" >&2
