#!/usr/bin/env bash
# Install the system packages the test tiers need: Prometheus and Alertmanager for e2e, openssl
# for the testbed's certificates, jemalloc for the operator, venv for the project's virtualenv. Idempotent: only packages that are not installed yet go to
# apt-get, so a prepared machine makes no network call. Go is not installed here: Debian's
# golang-go (1.19) is too old for Kubernetes 1.34 (go >= 1.24); hack/build-binaries.sh checks it.
#
# Usage: hack/install-system-deps.sh   (as root, or with sudo available)
set -euo pipefail

# libjemalloc2: the operator runs under jemalloc where it is installed (VLM_ALLOCATOR=auto), as in its image,
# so the tiers run the operator as shipped.
PKGS=(prometheus prometheus-alertmanager openssl ca-certificates libjemalloc2)
# python3-venv: `make setup` makes the project's venv (.venv) with `python3 -m venv`, which needs ensurepip; Debian
# ships it apart from python3. Only where the python3 on PATH lacks it (a python3 not from Debian has its own).
if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then PKGS+=(python3-venv); fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "[install-system-deps] all present: ${PKGS[*]}" >&2
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "[install-system-deps] installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: Prometheus recommends node-exporter and friends we never start.
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The Debian packages start system services; tests run their own instances on other ports.
for svc in prometheus prometheus-alertmanager; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
done
