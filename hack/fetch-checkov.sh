#!/usr/bin/env bash
# Checkov, the third-party scanner of tests/unit/packaging/test_checkov.py, in a venv of its own under the cache
# (`make fetch`, before the tests; the test only runs it):
#
#   ~/.cache/vlm-operator/checkov-venv/<version>     (VLM_CACHE/checkov-venv/<version>)
#
# Its dependencies conflict with the project's pins (pydantic among them), so it never enters the project's venv.
# Idempotent: a venv with its .complete marker (written after `checkov --version` answered) is kept; one left
# half-made is made again; concurrent runs wait on a lock. Cold: uv (the project venv's, when on PATH as `make`
# puts it) or pip from PyPI, about 30-60 s with pip.
#
# Usage: hack/fetch-checkov.sh [--print-bin]   (prints the checkov executable)
#   env: PYTHON (the interpreter the venv is made from; default python3), VLM_CACHE
set -euo pipefail
CHECKOV_VERSION=3.3.30
CACHE="${VLM_CACHE:-$HOME/.cache/vlm-operator}"
VENV="$CACHE/checkov-venv/$CHECKOV_VERSION"
if [[ "${1:-}" == "--print-bin" ]]; then echo "$VENV/bin/checkov"; exit 0; fi
log() { printf '[fetch-checkov] %s\n' "$*" >&2; }

made() { [[ -x "$VENV/bin/checkov" && "$(cat "$VENV/.complete" 2>/dev/null)" == "$CHECKOV_VERSION" ]]; }
# Nothing of the caller's Python environment (the project's venv, its paths or pip constraints) leaks in.
clean() {
  env -u PYTHONPATH -u PYTHONHOME -u PIP_CONSTRAINT -u PIP_REQUIRE_HASHES -u VIRTUAL_ENV \
    PYTHONNOUSERSITE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
}

if ! made; then
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$(dirname "$VENV")/$CHECKOV_VERSION.lock"
  flock 9
  if ! made; then
    log "pip install checkov==$CHECKOV_VERSION into $VENV"
    rm -rf "$VENV"
    # The base interpreter, not a venv's: a venv made from another venv's python links to that venv.
    base="$(clean "${PYTHON:-python3}" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')"
    if command -v uv >/dev/null; then  # the project venv's uv (make venv): 5x faster than pip here
      clean uv venv -q --python "$base" "$VENV"
      clean nice -n 10 uv pip install -q --python "$VENV/bin/python" "checkov==$CHECKOV_VERSION"
    else
      clean "$base" -m venv "$VENV"
      clean nice -n 10 "$VENV/bin/python" -m pip install -q --no-input "checkov==$CHECKOV_VERSION"
    fi
    got="$(clean "$VENV/bin/checkov" --version)"
    [[ "$got" == "$CHECKOV_VERSION" ]] || { log "checkov --version answers '$got', not $CHECKOV_VERSION"; exit 1; }
    echo "$CHECKOV_VERSION" >"$VENV/.complete"
  fi
fi
echo "$VENV/bin/checkov"
