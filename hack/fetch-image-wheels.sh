#!/usr/bin/env bash
# The wheels the images' install steps take from PyPI, for tests/unit/packaging/test_dockerfile.py, which replays
# those steps (`make fetch`, before the tests; the replay then installs with --no-index from here):
#
#   ~/.cache/vlm-operator/image-wheels/<key>/     (VLM_CACHE/image-wheels; key: a hash of the two locks and the
#                                                  build backend's requirements)
#     every pinned file of requirements/operator.txt and requirements/sidecar.txt (hash-checked, wheels only, as
#     the Dockerfile installs them) and pyproject.toml's [build-system] requires (setuptools, wheel: the build
#     stage's `pip wheel /src` installs them into its isolated build environment)
#
# Idempotent: a directory with its .complete marker is kept; a lock or build backend change gives a new key.
# Concurrent runs wait on a lock. Cold: about 150 MB from PyPI (less with pip's own cache warm).
#
# Usage: hack/fetch-image-wheels.sh [--print-dir]   (prints the directory)
#   env: PYTHON (whose pip downloads, the interpreter the replay runs: default python3), VLM_CACHE
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
PY="${PYTHON:-python3}"
build_requires() {
  "$PY" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
    "$ROOT/pyproject.toml"
}
mapfile -t BUILD_REQUIRES < <(build_requires)
key="$( { cat "$ROOT/requirements/operator.txt" "$ROOT/requirements/sidecar.txt"; printf '%s\n' "${BUILD_REQUIRES[@]}"; } \
  | sha256sum | cut -c1-12)"
DIR="$CACHE/image-wheels/$key"
if [[ "${1:-}" == "--print-dir" ]]; then echo "$DIR"; exit 0; fi
log() { printf '[fetch-image-wheels] %s\n' "$*" >&2; }

if [[ ! -f "$DIR/.complete" ]]; then
  mkdir -p "$CACHE/image-wheels"
  exec 9>"$CACHE/image-wheels/.lock"
  flock 9
  if [[ ! -f "$DIR/.complete" ]]; then
    log "pip download: requirements/operator.txt, requirements/sidecar.txt, ${BUILD_REQUIRES[*]}"
    rm -rf "$DIR.tmp" && mkdir -p "$DIR.tmp"
    pip=("$PY" -m pip download -q --disable-pip-version-check --no-input --only-binary=:all: -d "$DIR.tmp")
    for lock in operator sidecar; do
      env -u PIP_CONSTRAINT "${pip[@]}" --require-hashes -r "$ROOT/requirements/$lock.txt"
    done
    env -u PIP_CONSTRAINT "${pip[@]}" "${BUILD_REQUIRES[@]}"
    touch "$DIR.tmp/.complete"
    rm -rf "$DIR" && mv "$DIR.tmp" "$DIR"
    log "$(find "$DIR" -name '*.whl' | wc -l) wheels in $DIR"
  fi
fi
echo "$DIR"
