# Sourced by the build scripts that compile a third-party Go module from a copy or a wrapper module
# (hack/build-keda.sh, hack/build-argo-rollouts.sh). Needs CACHE set and a `log` function.

# module_dir MODULE VERSION: the module's directory in the Go module cache (downloaded when missing: `make fetch`
# downloads it before the tests), or exit 1 saying what `go mod download` answered.
module_dir() {
  local out dir
  mkdir -p "$CACHE/src"
  out="$(cd "$CACHE/src" && go mod download -json "$1@$2" 2>&1)" || true
  dir="$(sed -n 's/.*"Dir": "\(.*\)",/\1/p' <<<"$out")"
  [[ -d "$dir" ]] || { log "go mod download $1@$2 gave no directory: $(tr -s ' \n' ' ' <<<"$out" | cut -c1-300)"; exit 1; }
  echo "$dir"
}
