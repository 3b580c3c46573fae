#!/usr/bin/env bash
# KEDA's operator and metrics API server (v2.21.0) for the autoscaling tests (docs/autoscaling.md), from the Go
# module proxy into the binary cache; never committed. Idempotent and cached by version: a second run is a no-op;
# concurrent runs wait on a lock. Its CRDs are fetched with the other third-party CRDs by hack/fetch-crds.sh.
#
# Usage: hack/build-keda.sh [--trim-only DIR]
#   --trim-only DIR: write the trimmed copy of KEDA's source to DIR and stop (what the unit test checks)
#   keda-operator-$TAG and keda-adapter-$TAG into $CACHE/bin, through a wrapper module: `go install` refuses
#   KEDA's module (its go.mod has replace and exclude directives, copied into the wrapper).
#
# Built with the scalers the operator's ScaledObjects use (prometheus, and cpu and memory, KEDA's built-in
# resource triggers) and no others: KEDA registers its ~75 scalers in one switch (pkg/scaling/scalers_builder.go)
# over one package (pkg/scalers), so every cloud SDK and database client is compiled in whichever a cluster uses.
# The build copies KEDA's source, removes the other scalers' files, keeps only those three cases of the switch
# (another trigger type gets KEDA's own "no scaler found" error, naming this build) and adds the one constant the
# removed files defined. Nothing else of KEDA changes: the controllers, the metrics server, the HPA it writes, the
# prometheus scaler's code. Measured on this 2-core machine (empty Go build cache): 3453 -> 1707 packages,
# 18.8k -> 8.0k Go files, the operator 177 -> 75 MB; a cold build (empty Go build cache, the machine otherwise
# idle) 543 s -> 249 s, 1054 -> 480 core-seconds (docs/testbed.md, "Test tiers and their budgets").
# KEDA_SCALERS=all builds KEDA whole (binaries tagged -all).
set -euo pipefail

VERSION="${KEDA_VERSION:-v2.21.0}"  # v2.21.1 needs a newer Go than this machine's
SCALERS="${KEDA_SCALERS:-trimmed}"
case "$SCALERS" in
  trimmed) TAG="$VERSION-prometheus-cpu-memory" ;;
  all) TAG="$VERSION-all" ;;
  *) echo "[build-keda] KEDA_SCALERS is trimmed or all, not '$SCALERS'" >&2; exit 1 ;;
esac
MODULE=github.com/kedacore/keda/v2
CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
BIN="$CACHE/bin"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
command -v go >/dev/null || { echo "[build-keda] go not found" >&2; exit 1; }
mkdir -p "$BIN" "$CACHE/src"
log() { printf '[build-keda] %s\n' "$*" >&2; }
exec 9>"$CACHE/build-keda-wrapper.lock"  # not build-keda.lock: build-binaries.sh holds that one around this script
flock 9

# shellcheck source=hack/go-module.sh
. "$(dirname "$0")/go-module.sh"  # module_dir: KEDA's module in the Go module cache (make fetch downloads it)

# trim SRC DEST: a writable copy of KEDA's module SRC (the module cache is read-only) in DEST, with three scalers.
trim() {
  rm -rf "$2"
  cp -r "$1" "$2"
  chmod -R u+w "$2"
  (
    cd "$2/pkg/scalers"
    find . -name '*_test.go' -delete
    for f in *_scaler.go; do
      case "$f" in prometheus_scaler.go|cpu_memory_scaler.go) ;; *) rm -f "$f" ;; esac
    done
    printf '%s\n\npackage scalers\n\nconst externalMetricType = "External"\n' \
      "// Added by vlm-operator's hack/build-keda.sh: defined in a removed scaler's file, used by the kept ones." \
      >vlm_trimmed.go
    # The switch in buildScaler: its cases up to `default:` become the three kept ones.
    awk '
      /^\tswitch triggerType \{$/ && !done { print; print "\tcase \"cpu\":\n\t\treturn scalers.NewCPUMemoryScaler(corev1.ResourceCPU, config)\n\tcase \"memory\":\n\t\treturn scalers.NewCPUMemoryScaler(corev1.ResourceMemory, config)\n\tcase \"prometheus\":\n\t\treturn scalers.NewPrometheusScaler(config)"; skip=1; next }
      skip && /^\tdefault:$/ { skip=0; done=1 }
      skip { next }
      { sub(/"no scaler found for type: %s"/, "\"no scaler found for type: %s (this KEDA is built with the prometheus, cpu and memory scalers only)\""); print }
    ' ../scaling/scalers_builder.go >../scaling/scalers_builder.go.new
    mv ../scaling/scalers_builder.go.new ../scaling/scalers_builder.go
    n=$(grep -c 'return scalers\.New' ../scaling/scalers_builder.go)
    grep -q 'built with the prometheus, cpu and memory scalers only' ../scaling/scalers_builder.go && ((n == 3)) || {
      log "KEDA $VERSION's scalers_builder.go changed shape ($n scaler cases after trimming, want 3): KEDA_SCALERS=all builds it whole"
      exit 1
    }
  )
}

if [[ "${1:-}" == "--trim-only" ]]; then
  [[ -n "${2:-}" ]] || { log "--trim-only needs a directory"; exit 2; }
  src="$(module_dir "$MODULE" "$VERSION")"
  trim "$src" "$2" || exit 1
  exit 0
fi
if [[ -x "$BIN/keda-operator-$TAG" && -x "$BIN/keda-adapter-$TAG" ]]; then
  ln -sf "keda-operator-$TAG" "$BIN/keda-operator"; ln -sf "keda-adapter-$TAG" "$BIN/keda-adapter"
  exit 0
fi
src="$(module_dir "$MODULE" "$VERSION")"
replace=""
if [[ "$SCALERS" == trimmed ]]; then
  trimmed="$CACHE/src/keda-trimmed-$VERSION"
  rm -rf "$trimmed"
  trim "$src" "$trimmed.tmp" || exit 1
  mv "$trimmed.tmp" "$trimmed"
  replace="replace $MODULE => $trimmed"
fi
work="$CACHE/src/keda-wrapper-$TAG"
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
  echo "$replace"
} >go.mod
printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/operator"\n\t_ "%s/cmd/adapter"\n)\n' \
  "$MODULE" "$MODULE" >tools.go
log "go mod tidy ($TAG)"
go mod tidy >&2
# One `go build` for both: the adapter reuses the operator's packages and the two links run in parallel.
log "go build operator adapter ($TAG; minutes on 2 cores)"
t0=$(date +%s)
out="$(mktemp -d "$BIN/.keda-build.XXXXXX")"
go build -trimpath "-gcflags=all=-dwarf=false" -ldflags "-s -w" -o "$out/" "$MODULE/cmd/operator" "$MODULE/cmd/adapter"
for cmd in operator adapter; do
  mv "$out/$cmd" "$BIN/keda-$cmd-$TAG"
  ln -sf "keda-$cmd-$TAG" "$BIN/keda-$cmd"
done
rm -rf "$out"
log "built $BIN/keda-operator-$TAG, keda-adapter-$TAG ($(( $(date +%s) - t0 ))s)"
