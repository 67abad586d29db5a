#!/bin/sh
# Installs the onedir build (dist/eie) as a systemd service:
#   $PREFIX (/opt/eie)                the frozen executable and its libraries
#   /etc/systemd/system/eie.service   the unit, pointing at $PREFIX
#   /usr/lib/sysusers.d/eie.conf      the dedicated user (eie, in render and video)
#   /etc/eie/eie.yaml, eie.env        a default config and environment (kept when present)
# Usage: systemd/install.sh [DIST_DIR]   (DESTDIR=staging root, PREFIX=/opt/eie, CONFIG=preset)
# With an empty DESTDIR, as root on a systemd host, it also creates the user and reloads systemd;
# `systemctl enable --now eie` starts it.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
dist=${1:-$here/../dist/eie}
destdir=${DESTDIR:-}
prefix=${PREFIX:-/opt/eie}
config=${CONFIG:-$here/../presets/edge-box.yaml}

if [ ! -x "$dist/eie" ]; then
  echo "install.sh: no executable $dist/eie (run 'make binary' first)" >&2
  exit 1
fi

install -d "$destdir$prefix" "$destdir/etc/systemd/system" "$destdir/usr/lib/sysusers.d" "$destdir/etc/eie"
rm -rf "$destdir$prefix/_internal"
cp -a "$dist/." "$destdir$prefix/"
[ -f "$here/../README.md" ] && install -m 0644 "$here/../README.md" "$destdir$prefix/README.md"
sed "s#/opt/eie#$prefix#g" "$here/eie.service" > "$destdir/etc/systemd/system/eie.service"
chmod 0644 "$destdir/etc/systemd/system/eie.service"
install -m 0644 "$here/eie.sysusers.conf" "$destdir/usr/lib/sysusers.d/eie.conf"
if [ ! -f "$destdir/etc/eie/eie.yaml" ]; then
  # models live read-only under $prefix/models; the service reads nothing else
  sed "s#^model_dir:.*#model_dir: $prefix/models#" "$config" > "$destdir/etc/eie/eie.yaml"
  chmod 0644 "$destdir/etc/eie/eie.yaml"
fi
[ -f "$destdir/etc/eie/eie.env" ] || install -m 0644 "$here/eie.env" "$destdir/etc/eie/eie.env"
install -d "$destdir$prefix/models"

if [ -z "$destdir" ] && [ "$(id -u)" = 0 ] && [ -d /run/systemd/system ]; then
  systemd-sysusers /usr/lib/sysusers.d/eie.conf
  systemctl daemon-reload
  echo "installed; start with: systemctl enable --now eie" >&2
else
  echo "installed under ${destdir:-/} (no systemd reload: staging root or not root)" >&2
fi
