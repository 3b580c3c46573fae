#!/usr/bin/env bash
# KEDA's operator and metrics API server (v2.21.0) for the autoscaling tests (docs/autoscaling.md), from the Go
# module proxy into the binary cache; never committed. Idempotent and cached by version: a second run is a no-op;
# concurrent runs wait on a lock. Its CRDs are fetched with the other third-party CRDs by hack/fetch-crds.sh.
#
# Usage: hack/build-keda.sh
#   keda-operator-$VERSION and keda-adapter-$VERSION into $CACHE/bin, through a wrapper module: `go install` refuses
#   KEDA's module (its go.mod has replace and exclude directives, copied into the wrapper). Both link every scaler:
#   the first is the long build, the second reuses its compiled packages.
set -euo pipefail

VERSION="${KEDA_VERSION:-v2.21.0}"  # v2.21.1 needs a newer Go than this machine's
MODULE=github.com/kedacore/keda/v2
CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
BIN="$CACHE/bin"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
command -v go >/dev/null || { echo "[build-keda] go not found" >&2; exit 1; }
mkdir -p "$BIN" "$CACHE/src"
log() { printf '[build-keda] %s\n' "$*" >&2; }
exec 9>"$CACHE/build-keda-wrapper.lock"  # not build-keda.lock: build-binaries.sh holds that one around this script
flock 9

if [[ -x "$BIN/keda-operator-$VERSION" && -x "$BIN/keda-adapter-$VERSION" ]]; then
  ln -sf "keda-operator-$VERSION" "$BIN/keda-operator"; ln -sf "keda-adapter-$VERSION" "$BIN/keda-adapter"
  exit 0
fi
src="$(cd "$CACHE/src" && go mod download -json "$MODULE@$VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')"
[[ -d "$src" ]] || { log "go mod download $MODULE@$VERSION gave no directory"; exit 1; }
work="$CACHE/src/keda-wrapper-$VERSION"
rm -rf "$work" && mkdir -p "$work"
cd "$work"
{
  echo "module vlmops.dev/keda-wrapper"
  echo
  sed -n 's/^go \(.*\)$/go \1/p' "$src/go.mod"
  echo
  echo "require $MODULE $VERSION"
  echo
  # single-line and block replace/exclude directives, as KEDA's go.mod writes them
  sed -n -e '/^replace (/,/^)/p' -e '/^exclude (/,/^)/p' -e '/^replace [^(]/p' -e '/^exclude [^(]/p' "$src/go.mod"
} >go.mod
printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/operator"\n\t_ "%s/cmd/adapter"\n)\n' \
  "$MODULE" "$MODULE" >tools.go
log "go mod tidy ($VERSION)"
go mod tidy >&2
for cmd in operator adapter; do
  log "go build $cmd ($VERSION; the first one tens of minutes on 2 cores)"
  t0=$(date +%s)
  go build -trimpath -ldflags "-s -w" -o "$BIN/keda-$cmd-$VERSION.tmp" "$MODULE/cmd/$cmd"
  mv "$BIN/keda-$cmd-$VERSION.tmp" "$BIN/keda-$cmd-$VERSION"
  ln -sf "keda-$cmd-$VERSION" "$BIN/keda-$cmd"
  log "built $BIN/keda-$cmd-$VERSION ($(( $(date +%s) - t0 ))s)"
done
