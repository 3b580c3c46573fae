#!/usr/bin/env bash
# All three parts in one GPU-machine call (device time is scarce): OUT=out/gpu bash bench/gpu/run_all.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-out/gpu}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, platform; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version())'
  nproc; uname -r
  timeout 240 bash bench/gpu/part1.sh
  timeout 330 bash bench/gpu/loop.sh --rounds 3 --window 8
} 2>&1 | tee "$out/run.log"
