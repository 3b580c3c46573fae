#!/usr/bin/env bash
# Flagger's CRDs for the judge's tests (docs/judge.md), from the Go module proxy into the cache (a download; no
# build). Idempotent, cached by version, never committed. Prints the CRD file's path.
set -euo pipefail

VERSION="${FLAGGER_VERSION:-v1.36.1}"
CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
OUT="$CACHE/flagger-crds-$VERSION/crd.yaml"
if [[ ! -f "$OUT" ]]; then
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod
  mkdir -p "$CACHE/src"
  exec 9>"$CACHE/fetch-flagger-crds.lock"
  flock 9
  if [[ ! -f "$OUT" ]]; then
    dir="$(cd "$CACHE/src" && go mod download -json "github.com/fluxcd/flagger@$VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')"
    [[ -f "$dir/artifacts/flagger/crd.yaml" ]] || { echo "[fetch-flagger-crds] no CRDs in $dir" >&2; exit 1; }
    mkdir -p "$(dirname "$OUT")"
    cp "$dir/artifacts/flagger/crd.yaml" "$OUT.tmp" && chmod u+w "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
  fi
fi
echo "$OUT"
