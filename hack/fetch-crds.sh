#!/usr/bin/env bash
# Fetch the CRDs of the serving stacks the guides cover (docs/guides/), from the Go module proxy, into the cache:
#
#   ~/.cache/vlm-operator/crds/          (VLM_CACHE/crds)
#     kserve-v0.15.2/serving.kserve.io_inferenceservices.yaml, serving.kserve.io_servingruntimes.yaml
#     lws-v0.7.0/leaderworkerset.x-k8s.io_leaderworkersets.yaml
#     gaie-v1.6.2/inference.networking.k8s.io_inferencepools.yaml   (Gateway API Inference Extension: llm-d)
#
# Each project publishes its CRDs in its Go module (config/crd/...), so `go mod download` of one tagged version
# gives the same files a release installs; nothing is built. Idempotent: a version already in the cache is not
# fetched again. tests/integration/test_guides.py runs this and installs the CRDs on the testbed to check the
# guides' manifests with a server-side dry run.
#
# Usage: hack/fetch-crds.sh   (prints the cache directory)
set -euo pipefail
cache="${VLM_CACHE:-$HOME/.cache/vlm-operator}/crds"
log() { printf '[fetch-crds] %s\n' "$*" >&2; }
command -v go >/dev/null || { log "go not found (the control plane's build needs it too)"; exit 1; }

# name  module@version  files under the module's root
fetch() {
  local name=$1 modver=$2; shift 2
  local dest="$cache/$name"
  if [ -f "$dest/.complete" ]; then return 0; fi
  log "go mod download $modver"
  local dir
  dir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json "$modver" | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["Error"]) if d.get("Error") else print(d["Dir"])')
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  for f in "$@"; do cp "$dir/$f" "$dest.tmp/"; done
  chmod -R u+w "$dest.tmp"
  touch "$dest.tmp/.complete"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
}

mkdir -p "$cache"
fetch kserve-v0.15.2 github.com/kserve/kserve@v0.15.2 \
  config/crd/full/serving.kserve.io_inferenceservices.yaml config/crd/full/serving.kserve.io_servingruntimes.yaml
fetch lws-v0.7.0 sigs.k8s.io/lws@v0.7.0 config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml
fetch gaie-v1.6.2 sigs.k8s.io/gateway-api-inference-extension@v1.6.2 \
  config/crd/bases/inference.networking.k8s.io_inferencepools.yaml
echo "$cache"
