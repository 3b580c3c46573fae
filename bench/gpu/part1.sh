#!/usr/bin/env bash
# Part 1 on the GPU machine: reconstruct cost per feature and per request, IPC pool-handle cache off vs
# on, through each SGLang wheel in $WHL_DIR (0.5.10 and 0.5.23) and through torch alone.
# Run from the repo root:  OUT=out/gpu bash bench/gpu/part1.sh
# Each SGLang version goes into its own --target dir: two versions in one dir would clash.
set -uo pipefail
out=${OUT:-out/gpu}
whl=${WHL_DIR:-.whl}
mkdir -p "$out"
tmp=$(mktemp -d)
inputs=()
for w in "$whl"/sglang-*.whl; do
  v=$(basename "$w" | cut -d- -f2)
  site=/tmp/sglang-$v
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$w" || continue
  if python3 bench/gpu/ipc_reconstruct.py --impl sglang --site "$site" --out "$tmp/part1-sglang-$v.json"; then
    inputs+=("$tmp/part1-sglang-$v.json")
  fi
done
if python3 bench/gpu/ipc_reconstruct.py --impl torch --out "$tmp/part1-torch.json"; then
  inputs+=("$tmp/part1-torch.json")
fi
python3 bench/gpu/report.py part1 --out "$out" "${inputs[@]}" | tee "$out/part1.md"
