#!/usr/bin/env bash
# Build (once) and cache the control-plane binaries the testbed needs.
#
# Why a script and not a package: no registry ships kube-apiserver, so we build
# it from the Go module proxy through a wrapper module that pins every staging
# module (docs/testbed.md). Binaries live outside the repo, keyed by
# version, so a second run is a no-op and nothing built is ever committed.
#
# Usage: hack/build-binaries.sh [--print-dir | --print-pyspy-dir | --stage STAGE[,STAGE...]]
#   tools:      pyspy,helm (the unit tier needs both)
#   pyspy:      the sidecar image's py-spy (hack/build-pyspy.sh), which the tests and the demo sample with
#   helm:       helm, for the chart's tests (not the demo)
#   cluster:    etcd, kwok, kube-apiserver/-controller-manager/-scheduler, kubectl, and the Prometheus
#               Operator's CRDs (the integration and e2e tiers; `make test` builds these in the background,
#               at the lowest CPU priority, while the unit tier runs: testing/vlm_testing/binaries.py)
#   monitoring: the Prometheus Operator binary (its integration test and the e2e tier; built behind the
#               cluster stage, while the first integration tests run)
#   argo:       Argo Rollouts' controller (hack/build-argo-rollouts.sh; its CRDs come from hack/fetch-crds.sh), for
#               the judge's integration test (parallel pass); built behind the monitoring stage
#   flagger:    Flagger's controller and load tester (v1.36.1), for the judge's Flagger test (parallel pass)
#   prometheus: Prometheus with kubernetes_sd (Debian's has none), which the e2e tier's monitoring proof and pod
#               discovery (the heavy pass, after the parallel one) run on the generated configuration; built
#               behind the two the parallel pass waits for (a cold run, 2026-12-07, built it before them and the
#               Argo test waited 13 minutes for its controller)
#   keda:       KEDA's operator and metrics server (v2.21.0, three scalers; hack/build-keda.sh), for the autoscaling
#               e2e, which runs last; last
#   all:        tools,cluster,monitoring,argo,flagger,prometheus,keda (the default)
# `make demo` builds pyspy,cluster only: the demo runs Debian's Prometheus (file_sd), no helm, no Prometheus
# Operator, no Argo Rollouts.
# Each stage holds a lock of its own in the cache while it runs: a second run of a stage waits for the
# first and then finds everything built, and a run of one stage never waits for another stage's build.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.6}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.21.4}"
PROM_OPERATOR_VERSION="${PROM_OPERATOR_VERSION:-v0.85.0}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"  # the Go module's version of Prometheus 3.16.0
FLAGGER_VERSION="${FLAGGER_VERSION:-v1.36.1}"  # its CRD comes from hack/fetch-crds.sh, same version
CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
BIN="$CACHE/bin"

if [[ "${1:-}" == "--print-dir" ]]; then echo "$BIN"; exit 0; fi
# The directory holding only the sidecar's py-spy (build_pyspy), for PATH.
if [[ "${1:-}" == "--print-pyspy-dir" ]]; then echo "$CACHE/pyspy"; exit 0; fi
STAGE=all
if [[ "${1:-}" == "--stage" ]]; then STAGE="${2:-}"; fi
[[ "$STAGE" == all ]] && STAGE=tools,cluster,monitoring,argo,flagger,prometheus,keda
IFS=, read -ra GIVEN <<<"$STAGE"
((${#GIVEN[@]})) || GIVEN=("")  # an empty --stage is refused below, not taken as nothing to do
STAGES=()
for s in "${GIVEN[@]}"; do
  case "$s" in tools) STAGES+=(pyspy helm) ;;
    pyspy|helm|cluster|monitoring|prometheus|argo|flagger|keda) STAGES+=("$s") ;;
    *) echo "[build-binaries] unknown stage '$s' (tools = pyspy,helm; cluster, monitoring, prometheus, argo, flagger, keda, all)" >&2
       exit 2;; esac
done

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
# No debug information: the binaries are stripped at link time (-ldflags "-s -w") anyway, and without it the
# compiler writes less for each of the thousands of packages (a cold build is mostly compiling).
GOBUILD=(-trimpath "-gcflags=all=-dwarf=false")
command -v go >/dev/null || { echo "[build-binaries] go not found; need Go >= 1.24 (k8s $K8S_VERSION)" >&2; exit 1; }
# GOTOOLCHAIN=local means no toolchain download: fail early and clearly on an old Go (Debian's
# golang-go 1.19 is too old) instead of midway through a 15-minute build.
gov="$(go env GOVERSION)"; gov="${gov#go}"
if ! printf '1.24\n%s\n' "${gov%%[!0-9.]*}" | sort -V -C; then
  echo "[build-binaries] Go $gov is too old; need >= 1.24 for k8s $K8S_VERSION" >&2; exit 1
fi
mkdir -p "$BIN" "$CACHE/src"
log() { printf '[build-binaries] %s\n' "$*" >&2; }

have() { [[ -x "$BIN/$1-$2" ]]; }

link() {  # stable names the testbed uses -> versioned files
  ln -sf "$1-$2" "$BIN/$1"
}

build_k8s() {
  local comps=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  local missing=()
  for c in "${comps[@]}"; do have "$c" "$K8S_VERSION" || missing+=("$c"); done
  if ((${#missing[@]})); then
    local dir="$CACHE/src/k8s-$K8S_VERSION"
    mkdir -p "$dir"
    log "building ${missing[*]} $K8S_VERSION (cold: tens of minutes on 2 cores)"
    (
      cd "$dir"
      go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
      local kdir
      kdir="$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION"
      local minor="${K8S_VERSION#v1.}"  # 34.4 -> staging modules are v0.34.4
      {
        echo "module vlmops.dev/k8s-build"
        echo
        grep -E '^go [0-9]' "$kdir/go.mod"
        grep -E '^godebug ' "$kdir/go.mod" || true
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        grep -E '=> \./staging/src/' "$kdir/go.mod" | awk -v v="v0.$minor" '{print "\t" $1 " => " $1 " " v}'
        echo ")"
      } >go.mod
      printf 'package tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n\t_ "k8s.io/kubernetes/cmd/kubectl"\n)\n' >tools.go
      sed -i 's/^package tools/\/\/go:build tools\n\npackage tools/' tools.go
      go mod tidy -e >/dev/null 2>&1 || true
      go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
      local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
      # One `go build` for all of them: their links (a large share of a warm-cache build) run in parallel.
      log "go build ${missing[*]}"
      local out; out="$(mktemp -d "$BIN/.k8s-build.XXXXXX")"
      local pkgs=(); for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
      go build "${GOBUILD[@]}" -ldflags "$ld" -o "$out/" "${pkgs[@]}"
      for c in "${missing[@]}"; do mv "$out/$c" "$BIN/$c-$K8S_VERSION"; done
      rm -rf "$out"
    )
  fi
  for c in "${comps[@]}"; do link "$c" "$K8S_VERSION"; done
}

build_etcd() {
  if ! have etcd "$ETCD_VERSION"; then
    local dir="$CACHE/src/etcd-$ETCD_VERSION"
    mkdir -p "$dir"
    log "building etcd $ETCD_VERSION"
    (
      cd "$dir"
      printf 'module vlmops.dev/etcd-build\n\ngo 1.24\n' >go.mod
      printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
      go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
      go mod tidy -e >/dev/null 2>&1 || true
      go build "${GOBUILD[@]}" -ldflags "-s -w" -o "$BIN/etcd-$ETCD_VERSION.tmp" go.etcd.io/etcd/server/v3
      mv "$BIN/etcd-$ETCD_VERSION.tmp" "$BIN/etcd-$ETCD_VERSION"
    )
  fi
  link etcd "$ETCD_VERSION"
}

build_goinstall() {  # name version module-path
  local name="$1" ver="$2" pkg="$3"
  if ! have "$name" "$ver"; then
    log "go install $pkg@$ver"
    local tmp; tmp="$(mktemp -d)"
    GOBIN="$tmp" go install "${GOBUILD[@]}" -ldflags "-s -w" "$pkg@$ver"
    mv "$tmp/$name" "$BIN/$name-$ver"
    rm -rf "$tmp"
  fi
  link "$name" "$ver"
}

kwok_stages() {  # kwok's stage configs ship in its module, not in the binary
  local out="$CACHE/kwok-stages-$KWOK_VERSION"
  if [[ ! -d "$out" ]]; then
    go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" >/dev/null
    local kdir; kdir="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION"
    mkdir -p "$out.tmp"
    for s in node/fast node/heartbeat-with-lease pod/fast; do
      cp "$kdir/kustomize/stage/$s"/*.yaml "$out.tmp/"
    done
    rm -f "$out.tmp/kustomization.yaml"
    chmod -R u+w "$out.tmp"
    mv "$out.tmp" "$out"
  fi
  ln -sfn "$out" "$CACHE/kwok-stages"
}

PROM_OPERATOR_MOD=github.com/prometheus-operator/prometheus-operator

build_prometheus_operator() {
  # Its go.mod replaces its own submodules (pkg/apis/monitoring, pkg/client) with local paths, which
  # `go install pkg@version` refuses; a wrapper module requiring all three at one version builds cmd/operator.
  local ver="$PROM_OPERATOR_VERSION" mod="$PROM_OPERATOR_MOD"
  if ! have prometheus-operator "$ver"; then
    local dir="$CACHE/src/prometheus-operator-$ver"
    mkdir -p "$dir"
    log "building prometheus-operator $ver"
    (
      cd "$dir"
      go mod download -json "$mod@$ver" >/dev/null
      local pdir; pdir="$(go env GOMODCACHE)/$mod@$ver"
      {
        echo "module vlmops.dev/prometheus-operator-build"
        echo
        grep -E '^go [0-9]' "$pdir/go.mod"
        echo
        echo "require ("
        echo "	$mod $ver"
        echo "	$mod/pkg/apis/monitoring $ver"
        echo "	$mod/pkg/client $ver"
        echo ")"
      } >go.mod
      printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/operator"\n' "$mod" >tools.go
      go mod tidy -e >/dev/null 2>&1 || true
      local ld="-s -w -X github.com/prometheus/common/version.Version=${ver#v}"
      ld+=" -X github.com/prometheus/common/version.Revision=$ver -X github.com/prometheus/common/version.Branch=$ver"
      go build "${GOBUILD[@]}" -ldflags "$ld" -o "$BIN/prometheus-operator-$ver.tmp" "$mod/cmd/operator"
      mv "$BIN/prometheus-operator-$ver.tmp" "$BIN/prometheus-operator-$ver"
    )
  fi
  link prometheus-operator "$ver"
}

prometheus_operator_crds() {  # they ship in the module (example/prometheus-operator-crd): copied, not built
  local ver="$PROM_OPERATOR_VERSION" mod="$PROM_OPERATOR_MOD"
  local crds="$CACHE/prometheus-operator-crds-$ver"
  if [[ ! -d "$crds" ]]; then
    go mod download -json "$mod@$ver" >/dev/null
    mkdir -p "$crds.tmp"
    cp "$(go env GOMODCACHE)/$mod@$ver/example/prometheus-operator-crd"/*.yaml "$crds.tmp/"
    chmod -R u+w "$crds.tmp"
    mv "$crds.tmp" "$crds"
  fi
  ln -sfn "$crds" "$CACHE/prometheus-operator-crds"
}

build_pyspy() {
  # The sidecar image's py-spy (hack/build-pyspy.sh: crates.io source plus hack/patches/py-spy-*-vlm.patch),
  # keyed by the patch's hash; tests/conftest.py puts it first on PATH, so the tests sample with it.
  local key; key="0.4.3-vlm-$(sha256sum "$(dirname "$0")/patches/py-spy-0.4.3-vlm.patch" | cut -c1-12)"
  if ! have py-spy "$key"; then
    bash "$(dirname "$0")/build-pyspy.sh" "$BIN/py-spy-$key" "$CACHE/src/py-spy"
  fi
  mkdir -p "$CACHE/pyspy"
  ln -sf "$BIN/py-spy-$key" "$CACHE/pyspy/py-spy"
}

build_prometheus() {
  # Debian's Prometheus has no kubernetes_sd; this one has it and no other service discovery
  # (remove_all_sd + enable_kubernetes_sd, plugins/ in the module), which drops the SD plugins' cloud SDKs
  # (remote write's Azure AD / Google IAM auth still pulls some in). No web UI assets (no builtinassets
  # tag): the HTTP API is all the tests use. Its go.mod has no replace directives, so `go install pkg@version`
  # builds it. Module version v0.3MM.P is Prometheus 3.MM.P.
  local ver="$PROMETHEUS_VERSION" mod=github.com/prometheus/prometheus
  if ! have prometheus "$ver"; then
    local rel="${ver#v0.}"; rel="3.$((10#${rel%%.*} - 300)).${rel#*.}"
    log "go install $mod/cmd/prometheus@$ver (Prometheus $rel, kubernetes_sd only)"
    local tmp; tmp="$(mktemp -d)"
    local ld="-s -w -X github.com/prometheus/common/version.Version=$rel"
    ld+=" -X github.com/prometheus/common/version.Revision=$ver -X github.com/prometheus/common/version.Branch=$ver"
    GOBIN="$tmp" go install "${GOBUILD[@]}" -tags remove_all_sd,enable_kubernetes_sd -ldflags "$ld" "$mod/cmd/prometheus@$ver"
    mv "$tmp/prometheus" "$BIN/prometheus-$ver"
    rm -rf "$tmp"
  fi
  link prometheus "$ver"
}

for stage in "${STAGES[@]}"; do
  start=$(date +%s)
  exec 9>"$CACHE/build-$stage.lock"
  flock 9
  case "$stage" in
    pyspy)
      build_pyspy ;;
    helm)
      build_goinstall helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm ;;
    cluster)
      build_etcd
      build_goinstall kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
      kwok_stages
      build_k8s
      prometheus_operator_crds ;;
    monitoring)
      build_prometheus_operator ;;
    prometheus)
      build_prometheus ;;
    argo)  # Argo Rollouts' controller for the judge's tests (its own script, its own lock)
      bash "$(dirname "$0")/build-argo-rollouts.sh" --stage all ;;
    flagger)  # Flagger's controller and its load tester, for the judge's Flagger test (no replace directives)
      build_goinstall flagger "$FLAGGER_VERSION" github.com/fluxcd/flagger/cmd/flagger
      build_goinstall loadtester "$FLAGGER_VERSION" github.com/fluxcd/flagger/cmd/loadtester ;;
    keda)  # KEDA's operator and metrics server for spec.autoscaling's test (its own script, its own lock)
      bash "$(dirname "$0")/build-keda.sh" ;;
  esac
  exec 9>&-
  log "binaries ready in $BIN ($stage; $(( $(date +%s) - start ))s)"
done
