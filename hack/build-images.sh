#!/usr/bin/env bash
# Build the Dockerfile's two images (targets `operator` and `sidecar`) without a Docker engine, export them
# as OCI archives, and check them: the operator image's entry point starts, and the sidecar image's entry
# point, beside the SGLang stand-in, attaches py-spy and answers /windows.json with sampled windows.
#
# Builder: buildah (Debian's, daemonless; as root with --storage-driver vfs --isolation chroot). The
# Dockerfile is used as it is; only its base images are replaced, because no container registry can be
# reached where this was written (only package registries):
#   PYTHON_IMAGE (python:3.11.11-slim-bookworm)  -> a Debian bookworm rootfs from mmdebstrap with Debian's
#        python3 (3.11.2), python3-venv, python3-pip, python-is-python3, ca-certificates, netbase, tzdata,
#        docs/man/locales left out as in the slim images; passed with --build-arg PYTHON_IMAGE, so the
#        images' base.name label names the stand-in, not python:*;
#   rust:1.95.0-bookworm (the pyspy stage)       -> the same kind of rootfs with gcc, libc6-dev, curl,
#        patch, plus the host's rustup toolchain of that version (bookworm's rustc 1.63 cannot build py-spy
#        0.4.3), given to buildah with --build-context; the stage itself runs unchanged: hack/build-pyspy.sh
#        fetches the crate from crates.io, checks its sha256, patches and builds it with cargo --locked.
# The build stages reach PyPI, crates.io and Debian's mirror through the host's network; the host's CA
# bundle is mounted over the image's for RUN steps only (-v, never committed to a layer), for hosts whose
# egress goes through a TLS proxy (VLM_IMAGES_CA_BUNDLE= turns it off).
#
# Everything lives in ~/.cache/vlm-operator/images (VLM_IMAGES_CACHE), never in the repository:
#   rootfs/   the mmdebstrap tarballs, keyed by their package list (built once)
#   storage/  buildah's image store (--layers: a second run reuses every unchanged step)
#   out/      vlm-operator-VERSION.oci.tar, vlm-sidecar-VERSION.oci.tar, sizes.txt
#   check/    the archives unpacked (umoci) for the checks, recreated on every run
# Heavy steps run at nice 19 / idle I/O priority (VLM_IMAGES_NICE).
#
# Usage: hack/build-images.sh [--plan] [--no-check] [--target operator|sidecar|all]
#   --plan      print the build commands (argv) and exit without building anything
#   --no-check  build and export only
set -euo pipefail
{ # (one compound command: bash reads it whole, so editing this file mid-build cannot derail the build)

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${VLM_IMAGES_CACHE:-$HOME/.cache/vlm-operator/images}"
# The host-side stand-ins (SGLang, the model hub) run on the project's venv (`make images` passes it): the stand-in
# titles its scheduler with setproctitle, a test dependency, as the sidecar matches it.
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
SUITE=bookworm
MIRROR="${VLM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${VLM_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
CA_BUNDLE="${VLM_IMAGES_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
PYTHON_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,netbase,tzdata
RUST_PACKAGES=ca-certificates,curl,gcc,libc6-dev,make,patch,xz-utils,git
# As debian:bookworm-slim (under python:*-slim): no docs, man pages or translations. The rule stays in the
# image's /etc/dpkg/dpkg.cfg.d, so packages installed by the Dockerfile (libjemalloc2) follow it too.
DPKG_OPTS=(path-exclude=/usr/share/doc/* path-include=/usr/share/doc/*/copyright path-exclude=/usr/share/man/*
           path-exclude=/usr/share/locale/* path-exclude=/usr/share/info/* path-exclude=/usr/share/lintian/*)
# And as Debian's official images (debuerreotype's apt.conf.d/docker-*): apt keeps no .deb files, no package
# caches (/var/cache/apt/*.bin, ~30 MiB compressed in the operator's apt-get layer without it), no translations.
APT_CONF='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
Acquire::GzipIndexes "true";
APT::AutoRemove::SuggestsImportant "false";'

ARGS=("$@") PLAN=0 CHECK=1 TARGETS=(operator sidecar)
while (($#)); do
  case "$1" in
    --plan) PLAN=1 ;;
    --no-check) CHECK=0 ;;
    --target) case "${2:-}" in operator|sidecar) TARGETS=("$2") ;; all) ;; *)
                echo "[build-images] --target operator|sidecar|all" >&2; exit 2 ;; esac; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "[build-images] unknown argument '$1' (--plan, --no-check, --target)" >&2; exit 2 ;;
  esac
  shift
done

# Lowest CPU and I/O priority for everything below (another job may share the machine).
if ((!PLAN)) && [[ -z "${VLM_IMAGES_RENICED:-}" ]]; then
  export VLM_IMAGES_RENICED=1
  nice_cmd=(nice -n "${VLM_IMAGES_NICE:-19}")
  command -v ionice >/dev/null && nice_cmd+=(ionice -c 3)
  exec "${nice_cmd[@]}" bash "$0" "${ARGS[@]}"
fi

log() { printf '[build-images] %s\n' "$*" >&2; }
run() {  # print (--plan) or run one command
  if ((PLAN)); then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi
}

VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -1)"
RUST_IMAGE="$(sed -n 's/^FROM \(rust:[^ ]*\) AS pyspy$/\1/p' "$ROOT/Dockerfile")"
RUST_VERSION="${RUST_IMAGE#rust:}"; RUST_VERSION="${RUST_VERSION%%-*}"
[[ -n "$VERSION" && -n "$RUST_IMAGE" ]] || { log "cannot read the version (pyproject.toml) or the pyspy stage's image (Dockerfile)"; exit 1; }
key() { printf '%s\n' "$@" | sha256sum | cut -c1-12; }
PY_KEY="$(key "$SUITE" "$MIRROR" "$SECURITY_MIRROR" "$PYTHON_PACKAGES" "${DPKG_OPTS[@]}" "$APT_CONF")"
RUST_KEY="$(key "$SUITE" "$MIRROR" "$SECURITY_MIRROR" "$RUST_PACKAGES" "${DPKG_OPTS[@]}" "$RUST_VERSION")"
PY_BASE="localhost/vlm-standin/python:3.11-$SUITE-$PY_KEY"
RUST_BASE="localhost/vlm-standin/rust:$RUST_VERSION-$SUITE-$RUST_KEY"
BUILDAH=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)
image_name() { echo "vlmops/vlm-$1"; }   # operator -> vlmops/vlm-operator (the Dockerfile's comment)
archive() { echo "$CACHE/out/vlm-$1-$VERSION.oci.tar"; }

bud_argv() {  # the buildah build of one target
  local target="$1" rev created
  rev="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || true)"
  # The commit's time, not now: the same commit gives the same labels, and the layer cache holds.
  created="$(git -C "$ROOT" log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || true)"
  BUD=("${BUILDAH[@]}" bud --isolation chroot --layers --pull=never --file "$ROOT/Dockerfile" --target "$target"
       --build-arg "PYTHON_IMAGE=$PY_BASE" --build-context "$RUST_IMAGE=container-image://$RUST_BASE"
       --build-arg "VERSION=$VERSION" --build-arg "REVISION=$rev" --build-arg "CREATED=$created"
       --build-arg "SOURCE=${VLM_IMAGE_SOURCE:-}" --tag "$(image_name "$target"):$VERSION")
  [[ -n "$CA_BUNDLE" ]] && BUD+=(-v "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
  BUD+=("$ROOT")
}

ensure_tools() {
  local missing=()
  for t in buildah:buildah mmdebstrap:mmdebstrap umoci:umoci skopeo:skopeo; do
    command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
  done
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]} (Debian packages)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
}

have_image() { "${BUILDAH[@]}" images -q "$1" >/dev/null 2>&1 && [[ -n "$("${BUILDAH[@]}" images -q "$1" 2>/dev/null)" ]]; }

rootfs() {  # rootfs NAME PACKAGES [MMDEBSTRAP_OPTION...] -> $CACHE/rootfs/NAME.tar (mmdebstrap, once)
  local out="$CACHE/rootfs/$1.tar" opts=("${@:3}")
  [[ -s "$out" ]] && { ((PLAN)) || return 0; }
  for o in "${DPKG_OPTS[@]}"; do opts+=("--dpkgopt=$o"); done
  ((PLAN)) || { mkdir -p "$CACHE/rootfs" && printf '%s\n' "$APT_CONF" >"$CACHE/rootfs/docker-clean"; }
  ((PLAN)) || log "assembling a Debian $SUITE rootfs: $2"
  run mmdebstrap --quiet --variant=minbase --include="$2" "${opts[@]}" \
    "$SUITE" "${out%.tar}.tmp.tar" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main"
  ((PLAN)) || { mv "${out%.tar}.tmp.tar" "$out" && find "$CACHE/rootfs" -maxdepth 1 -name "${1%-*}-*.tar" ! -name "$1.tar" -delete; }
}

base_image() {  # base_image TAG ROOTFS_TAR [EXTRA_TAR DEST] -- CONFIG... : a one-layer image from the tarball(s)
  local tag="$1" tar="$2" extra="" dest="" ctr
  shift 2
  if [[ "$1" != -- ]]; then extra="$1" dest="$2"; shift 2; fi
  shift
  if ((!PLAN)) && have_image "$tag"; then return 0; fi
  log "committing $tag"
  if ((PLAN)); then ctr=CTR; else ctr="$("${BUILDAH[@]}" from scratch)"; fi
  run "${BUILDAH[@]}" add "$ctr" "$tar" /
  [[ -n "$extra" ]] && run "${BUILDAH[@]}" add "$ctr" "$extra" "$dest"
  run "${BUILDAH[@]}" config "$@" "$ctr"
  run "${BUILDAH[@]}" commit --rm --squash "$ctr" "$tag"
  # Stand-ins of other keys (an older package list): removed, or untagged while a cached build uses them.
  ((PLAN)) || "${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}' | grep "^${tag%:*}:" | grep -vx "$tag" \
    | xargs -r "${BUILDAH[@]}" rmi >/dev/null 2>&1 || true
}

rust_toolchain_tar() {  # the host's rustup toolchain for RUST_VERSION: bin/{cargo,rustc} and lib/, as /usr/local
  local tc out="$CACHE/rootfs/rust-$RUST_VERSION-toolchain.tar" have
  [[ -s "$out" ]] && { echo "$out"; return 0; }
  tc="$(readlink -f "${RUSTUP_HOME:-$HOME/.rustup}/toolchains/$RUST_VERSION-x86_64-unknown-linux-gnu")"
  [[ -x "$tc/bin/rustc" && -x "$tc/bin/cargo" ]] || {
    log "no Rust $RUST_VERSION toolchain at $tc (rustup toolchain install $RUST_VERSION): the pyspy stage needs it"; exit 1; }
  have="$("$tc/bin/rustc" --version | awk '{print $2}')"
  [[ "$have" == "$RUST_VERSION" ]] || { log "$tc/bin/rustc is $have, the Dockerfile's pyspy stage is $RUST_IMAGE"; exit 1; }
  tar -C "$tc" -cf "$out.tmp" bin/cargo bin/rustc lib && mv "$out.tmp" "$out"
  echo "$out"
}

if ((PLAN)); then
  rootfs "python-$SUITE-$PY_KEY" "$PYTHON_PACKAGES" --customize-hook="copy-in $CACHE/rootfs/docker-clean /etc/apt/apt.conf.d" \
  --customize-hook='rm -f "$1"/var/cache/apt/*.bin'
  rootfs "rust-$SUITE-$RUST_KEY" "$RUST_PACKAGES"
  for t in "${TARGETS[@]}"; do bud_argv "$t"; run "${BUD[@]}"; run "${BUILDAH[@]}" push "$(image_name "$t"):$VERSION" "oci-archive:$(archive "$t"):$(image_name "$t"):$VERSION"; done
  exit 0
fi

[[ "$(id -u)" == 0 ]] || { log "needs root (buildah --isolation chroot with the vfs driver, mmdebstrap, chroot for the checks)"; exit 1; }
mkdir -p "$CACHE"
exec 9>"$CACHE/build.lock"
flock 9
ensure_tools
start=$(date +%s)

rootfs "python-$SUITE-$PY_KEY" "$PYTHON_PACKAGES" --customize-hook="copy-in $CACHE/rootfs/docker-clean /etc/apt/apt.conf.d" \
  --customize-hook='rm -f "$1"/var/cache/apt/*.bin'
base_image "$PY_BASE" "$CACHE/rootfs/python-$SUITE-$PY_KEY.tar" -- \
  --env LANG=C.UTF-8 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd python3 \
  --label "org.opencontainers.image.description=Debian $SUITE with Debian's python3: stand-in for python:3.11-slim-$SUITE (hack/build-images.sh)"
if [[ " ${TARGETS[*]} " == *" sidecar "* ]]; then
  rootfs "rust-$SUITE-$RUST_KEY" "$RUST_PACKAGES"
  base_image "$RUST_BASE" "$CACHE/rootfs/rust-$SUITE-$RUST_KEY.tar" "$(rust_toolchain_tar)" /usr/local -- \
    --env CARGO_HOME=/usr/local/cargo --env RUST_VERSION="$RUST_VERSION" \
    --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash \
    --label "org.opencontainers.image.description=Debian $SUITE with the host's Rust $RUST_VERSION: stand-in for $RUST_IMAGE (hack/build-images.sh)"
fi

# vfs stores every layer as a full copy and --layers keeps each build's intermediate images (the cache): past
# VLM_IMAGES_STORE_MAX_GB (16) the dangling ones go before building, and this build starts cold.
if (( $(du -sm "$CACHE/storage" | cut -f1) > ${VLM_IMAGES_STORE_MAX_GB:-16} * 1024 )); then
  log "image store over ${VLM_IMAGES_STORE_MAX_GB:-16} GB: pruning intermediate images"
  "${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
fi
mkdir -p "$CACHE/out"
for t in "${TARGETS[@]}"; do
  log "building target $t"
  bud_argv "$t"
  "${BUD[@]}" >"$CACHE/out/build-$t.log" 2>&1 || { tail -40 "$CACHE/out/build-$t.log" >&2; log "build of $t failed: $CACHE/out/build-$t.log"; exit 1; }
  rm -f "$(archive "$t")"
  "${BUILDAH[@]}" push --quiet "$(image_name "$t"):$VERSION" "oci-archive:$(archive "$t"):$(image_name "$t"):$VERSION"
done

# ---- unpack (umoci) and sizes ----
unpack() {  # unpack TARGET -> $CACHE/check/TARGET/{rootfs,config.json}
  local dir="$CACHE/check/$1"
  rm -rf "$dir" && mkdir -p "$dir"
  skopeo copy --quiet "oci-archive:$(archive "$1")" "oci:$dir/layout:check" >/dev/null
  umoci unpack --image "$dir/layout:check" "$dir/bundle" >/dev/null
}
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
{
  printf '%-14s %12s %12s %s\n' image compressed unpacked archive
  for t in "${TARGETS[@]}"; do
    unpack "$t"
    comp=$(stat -c %s "$(archive "$t")")
    unp=$(du -sb "$CACHE/check/$t/bundle/rootfs" | cut -f1)
    printf '%-14s %8s MiB %8s MiB %s\n' "vlm-$t" "$(mib "$comp")" "$(mib "$unp")" "$(archive "$t")"
  done
} | tee "$CACHE/out/sizes.txt" >&2

((CHECK)) || { log "built in $(( $(date +%s) - start ))s (checks skipped)"; exit 0; }

# ---- checks: each image's entry point, as its OCI config says (entrypoint, env, user), chrooted into the
# unpacked rootfs with the host's /proc and /dev (the pod shares the process namespace with SGLang) ----
oci() {  # oci TARGET FIELD -> the runtime config's process field, one item per line
  python3 - "$CACHE/check/$1/bundle/config.json" "$2" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["process"]
f = sys.argv[2]
print(*(p["args"] if f == "args" else p["env"] if f == "env" else [f'{p["user"]["uid"]}:{p["user"]["gid"]}'] if f == "user" else [p.get("cwd", "/")]), sep="\n")
EOF
}
# Enter the image as a container runtime would for this check: chroot into the rootfs, cwd from the config,
# every capability out of the bounding set except KEEP, then the image's uid/gid, then exec.
ENTER_PY='
import ctypes, os, sys
root, user, keep, cwd, *argv = sys.argv[1:]
keep = {int(c) for c in keep.split(",") if c}
libc = ctypes.CDLL(None, use_errno=True)
os.chroot(root)
os.chdir(cwd)
for cap in range(int(open("/proc/sys/kernel/cap_last_cap").read()) + 1):
    if cap not in keep and libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        sys.exit(f"PR_CAPBSET_DROP {cap}: {os.strerror(ctypes.get_errno())}")
uid, gid = (int(x) for x in user.split(":"))
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG SIGKILL again (a uid change clears the one unshare --kill-child set)
os.execvp(argv[0], argv)
'
in_image() {  # in_image TARGET KEEP ARG... : run ARGs (the entrypoint first) in the image, as its user, with its
  # env, the host's /proc and /dev (the pod shares the process namespace), a fresh /tmp, and no capability
  # but KEEP (comma-separated numbers, "" for none)
  local t="$1" keep="$2" r="$CACHE/check/$1/bundle/rootfs" env=() user cwd
  shift 2
  mapfile -t env < <(oci "$t" env)
  user="$(oci "$t" user)" cwd="$(oci "$t" cwd)"
  exec unshare --mount --fork --kill-child bash -c '
    r="$1"; shift
    mount --bind /proc "$r/proc" && mount --bind /dev "$r/dev" && mount -t tmpfs tmpfs "$r/tmp" \
      && exec python3 -c "$0" "$r" "$@"
  ' "$ENTER_PY" "$r" "$user" "$keep" "$cwd" env -i "${env[@]}" "$@"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Background processes: an image's is its `unshare --fork`, which ignores SIGTERM while its child runs: the
# entry point (its child) gets SIGTERM, then unshare SIGKILL if it is still there after 10 s (--kill-child
# takes the entry point with it); the stand-in gets SIGTERM (it stops its scheduler processes).
pids=() sigs=()
stop() {
  local p="${pids[$1]}"
  if [[ "${sigs[$1]}" == KILL ]]; then
    pkill -TERM -P "$p" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
  fi
  kill "-${sigs[$1]}" "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true
}
cleanup() { for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "$i"; done; }
trap cleanup EXIT

if [[ " ${TARGETS[*]} " == *" operator "* ]]; then
  mapfile -t entry < <(oci operator args)
  log "operator: entrypoint ${entry[*]} as $(oci operator user)"
  v="$(in_image operator "" "${entry[@]}" --version)"
  [[ "$v" == "$VERSION" ]] || { log "operator: --version said '$v', expected $VERSION"; exit 1; }
  in_image operator "" "${entry[@]}" --help | head -1 >&2
  # A real start with no cluster behind it: settings checked, re-executed under jemalloc, handlers loaded,
  # /metrics served, kopf started (its peering identity, user@host, is where uid 65532 without a passwd entry
  # crashed), and then it stops at the API login: no service account, no kubeconfig.
  port="$(free_port)" live="$(free_port)"
  (in_image operator "" env VLM_METRICS_PORT="$port" KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=1 \
    "${entry[@]}" --liveness "http://127.0.0.1:$live/healthz") >"$CACHE/check/operator.log" 2>&1 9>&- &
  pids+=($!) sigs+=(KILL)
  ok=0
  for _ in $(seq 60); do
    if curl -sf "http://127.0.0.1:$port/metrics" -o "$CACHE/check/operator-metrics.txt"; then ok=1; break; fi
    sleep 1
  done
  opid="$(pgrep -f "vlm_operator --liveness http://127.0.0.1:$live" | head -1 || true)"
  jem="$( [[ -n "$opid" ]] && grep -m1 -o '/[^ ]*libjemalloc[^ ]*' "/proc/$opid/maps" || true)"
  ((ok)) || { tail -20 "$CACHE/check/operator.log" >&2; log "operator: /metrics never answered"; exit 1; }
  log "operator: /metrics answers ($(grep -c '^vlm_' "$CACHE/check/operator-metrics.txt") vlm_ samples), allocator: ${jem:-pymalloc (no jemalloc mapped)}"
  [[ -n "$jem" ]] || { log "operator: not running under jemalloc (libjemalloc2 missing from the image?)"; exit 1; }
  login=0
  for _ in $(seq 60); do
    grep -q "LoginError: no API server credentials" "$CACHE/check/operator.log" && { login=1; break; }
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 1
  done
  stop $((${#pids[@]} - 1))
  ((login)) || { tail -20 "$CACHE/check/operator.log" >&2; log "operator: did not get as far as the API login"; exit 1; }
  log "operator: kopf started and stopped at the API login, as it should without a cluster ($CACHE/check/operator.log)"
  # The operator's Jobs run this image with `python -m ...`: the weights download (huggingface_hub, against a small
  # hub endpoint on this machine, into a read-only root's /tmp) and the load generator.
  hub_port="$(free_port)"
  "$PY" "$ROOT/testing/vlm_testing/standin/hub.py" --port "$hub_port" >"$CACHE/check/hub.log" 2>&1 &
  pids+=($!) sigs+=(TERM)
  for _ in $(seq 30); do curl -s -o /dev/null "http://127.0.0.1:$hub_port/" && break; sleep 0.2; done
  w="$(in_image operator "" env HF_HOME=/tmp/hf HF_ENDPOINT="http://127.0.0.1:$hub_port" HF_HUB_DISABLE_TELEMETRY=1 \
    python -m vlm_operator.jobs.weights --repo org/tiny-vl 2>&1 | tail -1)"
  grep -q '"commit"' <<<"$w" || { log "operator: the weights Job's program failed: $w"; exit 1; }
  log "operator: python -m vlm_operator.jobs.weights downloaded org/tiny-vl from a local hub: $w"
  in_image operator "" python -m vlm_operator.jobs.loadgen --help | head -1 >&2
  stop $((${#pids[@]} - 1))
fi

if [[ " ${TARGETS[*]} " == *" sidecar "* ]]; then
  mapfile -t entry < <(oci sidecar args)
  r="$CACHE/check/sidecar/bundle/rootfs"
  pv="$(chroot "$r" /opt/vlm/bin/py-spy --version)"
  log "sidecar: entrypoint ${entry[*]} as $(oci sidecar user), $pv"
  [[ "$pv" == *+vlm.* ]] || { log "sidecar: the image's py-spy is not the patched build ($pv)"; exit 1; }
  # The stand-in runs on the host (its own root filesystem, like the SGLang container); the sidecar in the
  # image with only CAP_SYS_PTRACE, as the operator's pod template gives it.
  sport="$(free_port)"
  (cd "$ROOT" && exec "$PY" testing/vlm_testing/standin/sglang_standin.py --model-path stand-in --port "$sport" --enable-metrics \
     --standin-version 0.5.23 --mm-feature-transport cuda_ipc --standin-request-rate 15) >"$CACHE/check/standin.log" 2>&1 9>&- &
  pids+=($!) sigs+=(TERM)
  spid=$!
  port="$(free_port)"
  (in_image sidecar 19 "${entry[@]}" --port "$port" --interval 4s --duration 2s --discovery-root-pid "$spid" \
    --sglang-metrics-url "http://127.0.0.1:$sport/metrics") >"$CACHE/check/sidecar.log" 2>&1 9>&- &
  pids+=($!) sigs+=(KILL)
  ok=0
  for _ in $(seq 60); do
    sleep 1
    curl -sf "http://127.0.0.1:$port/windows.json" -o "$CACHE/check/windows.json" || continue
    if python3 - "$CACHE/check/windows.json" <<'EOF'
import json, sys
ws = [w for w in json.load(open(sys.argv[1])) if w.get("result") == "ok" and w.get("samples", 0) > 0]
if len(ws) < 2:
    sys.exit(1)
w = ws[-1]
print(f"[build-images] sidecar: /windows.json has {len(ws)} windows with samples; newest: pid {w.get('pid')} "
      f"tp_rank {w.get('tp_rank')} {w.get('samples')} samples, {w.get('iterations')} loop iterations, "
      f"loop p95 {w.get('loop_p95_seconds', 0) * 1e3:.1f} ms", file=sys.stderr)
EOF
    then ok=1; break; fi
  done
  ((ok)) || { tail -20 "$CACHE/check/sidecar.log" >&2; log "sidecar: no sampled window in /windows.json within 60 s"; exit 1; }
fi
log "done in $(( $(date +%s) - start ))s; images in $CACHE/out (sizes.txt)"
exit
}
