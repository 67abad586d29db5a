#!/usr/bin/env bash
# Builds the arm64 release (dist-release/eie, for the Raspberry Pi stage) on an x86_64 Debian host.
# llama.cpp is cross-compiled here with the release's CMake flags (Debian's aarch64-linux-gnu GCC,
# minutes instead of hours under emulation); everything else runs as `make release` in an arm64
# Debian 12 chroot under qemu-user (pip, the models, PyInstaller, the RUNPATH check), which finds
# that wheel in its cache and compiles nothing (the release skips the op test).
# Needs root, network to the Debian mirror and PyPI, and
#   apt-get install debootstrap qemu-user-static g++-aarch64-linux-gnu
# Usage: images/pi-gen/build-arm64-release.sh [CHROOT_DIR]   (default: build/arm64-chroot)
# Then:  images/pi-gen/prepare.sh CHROOT_DIR/src/dist-release/eie CHROOT_DIR/src/models
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
root="$(realpath -m "${1:-$repo/build/arm64-chroot}")"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

[ "$(id -u)" = 0 ] || { echo "needs root (debootstrap, chroot, binfmt_misc)" >&2; exit 2; }
for tool in debootstrap qemu-aarch64-static aarch64-linux-gnu-g++; do
  command -v "$tool" >/dev/null || {
    echo "$tool missing: apt-get install debootstrap qemu-user-static g++-aarch64-linux-gnu" >&2; exit 2; }
done
# The kernel hands arm64 programs to qemu (the F flag opens it now, so it works inside the chroot).
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
fi

if [ ! -x "$root/usr/bin/python3.11" ]; then
  debootstrap --arch=arm64 --variant=minbase \
    --include=ca-certificates,python3.11,python3.11-venv,libpython3.11,make,git,g++,binutils,patch \
    bookworm "$root" "$mirror"
fi
# The host's trust store and resolver (a TLS-inspecting proxy's CA, a local DNS).
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
mounted=()
cleanup() { local m; for m in "${mounted[@]}"; do umount "$m" || true; done; }
trap cleanup EXIT
for m in proc sys dev dev/pts; do
  mountpoint -q "$root/$m" || { mount --bind "/$m" "$root/$m"; mounted=("$root/$m" "${mounted[@]}"); }
done

# The tracked tree, as a clean checkout would have it.
rm -rf "$root/src"
mkdir -p "$root/src"
git -C "$repo" ls-files -z | (cd "$repo" && tar --null -T - -cf -) | tar -xf - -C "$root/src"

flags="$(EIE_GPU=none "$repo/native/release-cmake-args.sh")"
# Cached under the key the chroot's own `make release` computes (same flags, aarch64, Python 3.11).
EIE_CROSS_AARCH64=1 EIE_CMAKE_ARGS="$flags" PYTHON=python3.11 \
  EIE_WHEEL_CACHE="$root/root/.cache/eie/wheels" "$repo/native/build-llama-wheel.sh" >/dev/null

env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  chroot "$root" sh -c 'cd /src && make release PYTHON=python3.11 && ./dist-release/eie/eie doctor'
echo "arm64 release: $root/src/dist-release/eie" >&2
