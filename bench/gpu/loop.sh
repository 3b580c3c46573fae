#!/usr/bin/env bash
# Parts 2 and 3 on the GPU machine: the scheduler stand-in with real CUDA IPC, cache off vs on, then
# no profiler vs the sidecar (py-spy --nonblocking) vs the sidecar with blocking py-spy.
# Run from the repo root:  OUT=out/gpu bash bench/gpu/loop.sh [standin_loop.py flags]
set -uo pipefail
out=${OUT:-out/gpu}
whl=${WHL_DIR:-.whl}
mkdir -p "$out"
# py-spy (the sidecar's profiler) and setproctitle (the stand-in's process title) are not on the image.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "$whl"/py_spy-*.whl "$whl"/setproctitle-*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
python3 bench/gpu/standin_loop.py --out "$out/loop.json" --log "$out/loop.log" "$@" || exit 1
python3 bench/gpu/report.py loop --out "$out" "$out/loop.json" | tee "$out/loop.md"
