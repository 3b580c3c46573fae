#!/usr/bin/env bash
# Build the py-spy the sidecar ships: py-spy PYSPY_VERSION from its crates.io source, checked against a
# pinned sha256, with hack/patches/py-spy-PYSPY_VERSION-*.patch applied, built with its own Cargo.lock.
#
# The patch (its header says more): `record --main-thread`, which reads only each process's main thread,
# no per-sample scan of every OS thread's status under --idle, and cached code-object strings. Against a
# stand-in scheduler with 4 Python and 56 native threads, at the operator's defaults, the sidecar averaged
# 0.056 cores with this build and 0.585 with the wheel's py-spy, which also fell behind its rate
# (docs/sidecar.md, "CPU cost"). The output format is the same; `--version` says "PYSPY_VERSION+vlm.N".
#
# Used by hack/build-binaries.sh (cached in ~/.cache/vlm-operator/bin) and by the Dockerfile's pyspy stage.
#
# Usage: hack/build-pyspy.sh OUT [WORKDIR]
set -euo pipefail

PYSPY_VERSION=0.4.3
PYSPY_SHA256=101ab8471e25ec1fa10d98fb637edb64e4caf958e29bf5d254ac804e863fa453
here="$(cd "$(dirname "$0")" && pwd)"
patch_file="$here/patches/py-spy-$PYSPY_VERSION-vlm.patch"

out="${1:?usage: hack/build-pyspy.sh OUT [WORKDIR]}"
work="${2:-$(mktemp -d)}"
log() { printf '[build-pyspy] %s\n' "$*" >&2; }

command -v cargo >/dev/null || { log "cargo not found: install a recent stable Rust (rustup; built here with 1.95)"; exit 1; }
for tool in curl sha256sum tar; do
  command -v "$tool" >/dev/null || { log "$tool not found"; exit 1; }
done
command -v patch >/dev/null || command -v git >/dev/null || { log "neither patch nor git found"; exit 1; }

mkdir -p "$work"
crate="$work/py-spy-$PYSPY_VERSION.crate"
if ! echo "$PYSPY_SHA256  $crate" | sha256sum -c --status - 2>/dev/null; then
  curl -sSfL --retry 3 -o "$crate.tmp" "https://static.crates.io/crates/py-spy/py-spy-$PYSPY_VERSION.crate"
  echo "$PYSPY_SHA256  $crate.tmp" | sha256sum -c --status - || { log "sha256 mismatch for $crate"; exit 1; }
  mv "$crate.tmp" "$crate"
fi
src="$work/py-spy-$PYSPY_VERSION"
rm -rf "$src"
tar -xzf "$crate" -C "$work"
if command -v patch >/dev/null; then
  patch -d "$src" -p1 --quiet <"$patch_file"
else
  (cd "$src" && git apply -p1 "$patch_file")
fi
log "building py-spy $PYSPY_VERSION with $(basename "$patch_file")"
CARGO_TARGET_DIR="$work/target" cargo build --release --locked --manifest-path "$src/Cargo.toml"
mkdir -p "$(dirname "$out")"
install -m 0755 "$work/target/release/py-spy" "$out.tmp"
mv "$out.tmp" "$out"
"$out" --version >&2
