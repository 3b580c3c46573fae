#!/usr/bin/env bash
# Download (once) and cache released SGLang wheels, for the compatibility test
# that checks the operator's IPC-cache table against real SGLang source.
#
# Why the wheels and not `pip install sglang`: the wheel is pure Python (~6 MB)
# and all we need is its source; installing it would pull a multi-GB CUDA torch.
# `--no-deps` keeps it to the one file. The cache lives outside the repo
# (shared with other helpers), so a second run is a no-op and works offline.
#
# Usage: hack/fetch-sglang-wheels.sh [--print-dir] [VERSION ...]
#   env: VLM_CACHE (default ~/.cache/vlm-operator), SGLANG_WHEEL_PLATFORM, SGLANG_WHEEL_PYTHON,
#        PYTHON (whose pip downloads; default python3, `make fetch` passes the project venv's)
#   default versions: the ones tests/compat/test_sglang_wheels.py reads.
# Prints the path of each wheel on stdout, one per line, in argument order.
# Exits non-zero (naming the version) if a wheel cannot be downloaded.
set -euo pipefail

CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
WHEELS="$CACHE/wheels"
DEFAULT_VERSIONS=(0.5.9 0.5.10 0.5.15 0.5.17 0.5.20 0.5.23)
# From 0.5.11 the wheels carry a small Rust extension and are per platform; the
# Python source we read is the same in each. Pin one platform so every machine
# caches the same file (and an arm64 laptop still finds a wheel).
PLATFORM="${SGLANG_WHEEL_PLATFORM:-manylinux_2_34_x86_64}"
PYVER="${SGLANG_WHEEL_PYTHON:-3.11}"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$WHEELS"; exit 0; fi

log() { printf '[fetch-sglang-wheels] %s\n' "$*" >&2; }

versions=("$@")
((${#versions[@]})) || versions=("${DEFAULT_VERSIONS[@]}")
mkdir -p "$WHEELS"

# Wheel names normalise the version (PEP 427), e.g. sglang-0.5.10.post1-py3-none-any.whl.
find_wheel() { compgen -G "$WHEELS/sglang-$1-*.whl" | head -n1 || true; }

for v in "${versions[@]}"; do
  whl="$(find_wheel "$v")"
  if [[ -z "$whl" ]]; then
    log "downloading sglang==$v"
    # Download into a temp dir first so an interrupted run never leaves a
    # half-written wheel that a later run would take for a cached one.
    tmp="$(mktemp -d "$WHEELS/.tmp.XXXXXX")"
    if ! "${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --platform "$PLATFORM" --python-version "$PYVER" \
        --implementation cp "sglang==$v" -d "$tmp" >&2; then
      rm -rf "$tmp"
      log "ERROR: could not download sglang==$v (no network to PyPI, or no such release)"
      exit 1
    fi
    mv "$tmp"/sglang-*.whl "$WHEELS"/
    rm -rf "$tmp"
    whl="$(find_wheel "$v")"
    [[ -n "$whl" ]] || { log "ERROR: pip returned no wheel for sglang==$v"; exit 1; }
  fi
  echo "$whl"
done
