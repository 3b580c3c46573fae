#!/usr/bin/env bash
# Argo Rollouts' controller for the judge's tests (docs/judge.md), from the Go module proxy into the binary cache;
# never committed. Idempotent and cached by version: a second run is a no-op; concurrent runs wait on a lock.
# Its CRDs are fetched with the other third-party CRDs by hack/fetch-crds.sh (`make fetch`), same version.
#
# Usage: hack/build-argo-rollouts.sh [--stage controller|all]
#   controller (= all): rollouts-controller built into $CACHE/bin/rollouts-controller-$VERSION (minutes), through
#               a wrapper module (`go install` refuses the module: its go.mod has a replace block, copied here)
set -euo pipefail

VERSION="${ARGO_ROLLOUTS_VERSION:-v1.8.3}"  # v1.9+ need Go >= 1.26.10; v1.8.3 builds with Go >= 1.23.4
MODULE=github.com/argoproj/argo-rollouts
CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
BIN="$CACHE/bin"
STAGE=all
if [[ "${1:-}" == "--stage" ]]; then STAGE="${2:-}"; fi
case "$STAGE" in controller|all) ;; *) echo "[build-argo-rollouts] unknown stage '$STAGE'" >&2; exit 2;; esac

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
command -v go >/dev/null || { echo "[build-argo-rollouts] go not found" >&2; exit 1; }
mkdir -p "$BIN" "$CACHE/src"
log() { printf '[build-argo-rollouts] %s\n' "$*" >&2; }
exec 9>"$CACHE/build-argo-rollouts.lock"
flock 9

# shellcheck source=hack/go-module.sh
. "$(dirname "$0")/go-module.sh"  # module_dir

if [[ ! -x "$BIN/rollouts-controller-$VERSION" ]]; then
  src="$(module_dir "$MODULE" "$VERSION")"
  work="$CACHE/src/argo-rollouts-wrapper-$VERSION"
  rm -rf "$work" && mkdir -p "$work"
  cd "$work"
  {
    echo "module vlmops.dev/argo-rollouts-wrapper"
    echo
    echo "go 1.23.4"
    echo
    echo "require $MODULE $VERSION"
    echo
    sed -n '/^replace (/,/^)/p' "$src/go.mod"
  } >go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/rollouts-controller"\n' "$MODULE" >tools.go
  log "go mod tidy ($VERSION)"
  go mod tidy >&2
  log "go build rollouts-controller ($VERSION; minutes)"
  # The same compiler flags as every other Go build here (hack/build-binaries.sh GOBUILD): the Go build cache then
  # holds one compile of the standard library for all of them, where different flags compiled it twice.
  go build -trimpath "-gcflags=all=-dwarf=false" -ldflags "-s -w" -o "$BIN/rollouts-controller-$VERSION.tmp" \
    "$MODULE/cmd/rollouts-controller"
  mv "$BIN/rollouts-controller-$VERSION.tmp" "$BIN/rollouts-controller-$VERSION"
  log "built $BIN/rollouts-controller-$VERSION"
fi
if [[ -x "$BIN/rollouts-controller-$VERSION" ]]; then ln -sf "rollouts-controller-$VERSION" "$BIN/rollouts-controller"; fi
