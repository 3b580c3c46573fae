#!/usr/bin/env bash
# Fetch the third-party CRDs the integration tier installs on the testbed, from the Go module proxy, into the cache
# (`make fetch`, which `make test` and `make setup` run before the tests; the tests only read the cache):
#
#   ~/.cache/vlm-operator/crds/          (VLM_CRD_CACHE, default VLM_CACHE/crds)
#     kserve-v0.15.2/serving.kserve.io_inferenceservices.yaml, serving.kserve.io_servingruntimes.yaml
#     lws-v0.7.0/leaderworkerset.x-k8s.io_leaderworkersets.yaml
#     gaie-v1.6.2/inference.networking.k8s.io_inferencepools.yaml   (Gateway API Inference Extension: llm-d)
#     flagger-v1.36.1/crd.yaml                                        (the judge's Flagger example)
#     argo-rollouts-v1.8.3/*-crd.yaml                                 (the judge's Argo Rollouts examples)
#     keda-v2.21.0/*.yaml                                             (spec.autoscaling: KEDA's operator watches all)
#
# Each project publishes its CRDs in its Go module, so `go mod download` of one tagged version gives the same files
# a release installs; nothing is built. The first three are for the guides (tests/integration/test_guides.py), the
# next two for the judge (test_judge_flagger.py, test_judge_argo.py), KEDA's for spec.autoscaling (test_autoscaling.py). Why not at test time: the integration tests run
# inside the testbed's network namespace, where no registry is reachable.
#
# Idempotent: a set already in the cache (its .complete marker) is not fetched again, so a warm run makes no network
# call; concurrent runs wait on a lock. Cold: about 10-20 s of downloads (Go module zips).
#
# Usage: hack/fetch-crds.sh [--print-dir | --list]   (prints the cache directory; --list: the sets' names, no fetch)
set -euo pipefail
CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
CRDS="${VLM_CRD_CACHE:-$CACHE/crds}"
if [[ "${1:-}" == "--print-dir" ]]; then echo "$CRDS"; exit 0; fi
FLAGGER_VERSION="${FLAGGER_VERSION:-v1.36.1}"
ARGO_ROLLOUTS_VERSION="${ARGO_ROLLOUTS_VERSION:-v1.8.3}"  # the controller hack/build-argo-rollouts.sh builds
KEDA_VERSION="${KEDA_VERSION:-v2.21.0}"  # v2.21.1 needs a newer Go than this machine's
log() { printf '[fetch-crds] %s\n' "$*" >&2; }
LIST=0; if [[ "${1:-}" == "--list" ]]; then LIST=1; fi

# name  module@version  files (globs) under the module's root
fetch() {
  local name=$1 modver=$2; shift 2
  if ((LIST)); then echo "$name"; return 0; fi
  local dest="$CRDS/$name"
  if [[ -f "$dest/.complete" ]]; then return 0; fi
  log "go mod download $modver"
  local json dir
  json="$(cd "$CRDS" && go mod download -json "$modver" 2>&1)" || { log "go mod download $modver failed:"; echo "$json" >&2; exit 1; }
  dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  [[ -d "$dir" ]] || { log "go mod download $modver gave no directory:"; echo "$json" >&2; exit 1; }
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  local f g n=0
  for f in "$@"; do
    for g in "$dir"/$f; do
      if [[ -f "$g" ]]; then cp "$g" "$dest.tmp/"; n=$((n + 1)); fi
    done
  done
  ((n)) || { log "no CRD files ($*) in $dir"; exit 1; }
  chmod -R u+w "$dest.tmp"
  touch "$dest.tmp/.complete"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
  log "$name: $n file(s) in $dest"
}

if ((!LIST)); then
  command -v go >/dev/null || { log "go not found (the control plane's build needs it too)"; exit 1; }
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod
  mkdir -p "$CRDS"
  exec 9>"$CRDS/.lock"
  flock 9
fi

fetch kserve-v0.15.2 github.com/kserve/kserve@v0.15.2 \
  config/crd/full/serving.kserve.io_inferenceservices.yaml config/crd/full/serving.kserve.io_servingruntimes.yaml
fetch lws-v0.7.0 sigs.k8s.io/lws@v0.7.0 config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml
fetch gaie-v1.6.2 sigs.k8s.io/gateway-api-inference-extension@v1.6.2 \
  config/crd/bases/inference.networking.k8s.io_inferencepools.yaml
fetch "flagger-$FLAGGER_VERSION" "github.com/fluxcd/flagger@$FLAGGER_VERSION" artifacts/flagger/crd.yaml
fetch "argo-rollouts-$ARGO_ROLLOUTS_VERSION" "github.com/argoproj/argo-rollouts@$ARGO_ROLLOUTS_VERSION" \
  'manifests/crds/*-crd.yaml'
fetch "keda-$KEDA_VERSION" "github.com/kedacore/keda/v2@$KEDA_VERSION" 'config/crd/bases/*.yaml'
((LIST)) || echo "$CRDS"
