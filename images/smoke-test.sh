#!/usr/bin/env bash
# Build an image and check it end to end: `eie doctor`, then the server with the image's own
# config (edge-box preset, both models): /health 200, a chat completion and a group answer from
# the real models, and a clean stop (SIGTERM, exit 0).
#   images/smoke-test.sh [cpu|cuda|rocm]      (default cpu; context: this checkout, or ROOT=<dir>)
# CONTAINER picks the CLI (docker or podman); BUILD_ARGS and RUN_ARGS add options, e.g. for
# rootful podman without a daemon-managed cgroup setup:
#   CONTAINER=podman BUILD_ARGS="--isolation chroot" RUN_ARGS="--runtime runc" images/smoke-test.sh
# The GPU images need the GPU passed in: RUN_ARGS="--gpus all" (cuda, NVIDIA container toolkit) or
# RUN_ARGS="--device /dev/kfd --device /dev/dri --group-add video" (rocm); doctor then names the GPU.
set -euo pipefail
flavour="${1:-cpu}"
cli="${CONTAINER:-docker}"
port="${PORT:-18080}"
tag="eie:$flavour"
name="eie-smoke-$flavour-$$"
root="${ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
read -r -a build_args <<< "${BUILD_ARGS:-}"
read -r -a run_args <<< "${RUN_ARGS:-}"

"$cli" build "${build_args[@]}" -f "$root/images/Containerfile.$flavour" -t "$tag" "$root"
"$cli" run --rm "${run_args[@]}" "$tag" doctor

cleanup() { "$cli" rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$cli" run -d --name "$name" -p "127.0.0.1:$port:8080" "${run_args[@]}" "$tag" >/dev/null
start=$(date +%s)
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
  if [ $(($(date +%s) - start)) -gt 300 ]; then
    "$cli" logs "$name" | tail -20
    echo "no /health 200 within 300 s" >&2
    exit 1
  fi
  sleep 0.5
done
echo "health 200 after $(($(date +%s) - start)) s"

post() {
  curl -sf "http://127.0.0.1:$port$1" -H 'content-type: application/json' -d "$2"
}
chat=$(post /v1/chat/completions \
  '{"model":"smollm2-135m","messages":[{"role":"user","content":"Name three colours."}],"max_tokens":24,"temperature":0}')
echo "$chat" | grep -q '"completion_tokens":24' || { echo "chat completion failed: $chat" >&2; exit 1; }
group=$(post /v1/batch/execute \
  '{"group":"both","messages":[{"role":"user","content":"Say hi."}],"max_tokens":8,"temperature":0}')
echo "$group" | grep -q '"complete":true' || { echo "group answer failed: $group" >&2; exit 1; }
echo "chat and group answers: ok"

"$cli" stop -t 30 "$name" >/dev/null
code=$("$cli" inspect "$name" --format '{{.State.ExitCode}}')
[ "$code" = 0 ] || { "$cli" logs "$name" | tail -20; echo "exit code $code after SIGTERM" >&2; exit 1; }
echo "stopped cleanly (exit 0): $tag passed"
