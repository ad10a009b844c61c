#!/usr/bin/env bash
# The main job: a 4-node lab (the host's GPUs split across it, or CPU-only) trains the
# classic asynchronous MNIST-style example end to end, then is torn down.
#   KEEP=1 ./scripts/demo.sh   keeps the lab up afterwards (tflab down --lab .demo/lab ends it)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

LAB=.demo/lab
gpu_args=(--gpus-per-node 0)
if command -v nvidia-smi >/dev/null && count=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l) && [ "$count" -gt 0 ]; then
    per_node=$(( count / 4 )); share=()
    [ "$per_node" -ge 1 ] || { per_node=1; share=(--share-gpus); }
    gpu_args=(--gpus-per-node "$per_node" "${share[@]}")
fi

tflab down --lab "$LAB" 2>/dev/null || true
# No --code, no --data, no --base: the bundled examples and digits, and a base that works
# with or without a registry (`auto`).
tflab gen --force --lab "$LAB" --nodes 4 "${gpu_args[@]}"
tflab up --lab "$LAB"
cleanup() { [ -n "${KEEP:-}" ] || tflab down --lab "$LAB"; }
trap cleanup EXIT

tflab run train --lab "$LAB"
tflab tensorboard --lab "$LAB"
echo
grep -h "test accuracy" "$LAB"/runs/train/logs/worker0.log | tail -n 1 | sed 's/^/result: /'
echo "checkpoints and summaries: $LAB/runs/train"
echo "reach a node: tflab ssh --lab $LAB worker1   (or: tflab exec --lab $LAB worker1 -- bash)"
[ -n "${KEEP:-}" ] && echo "the lab stays up (KEEP=1); end it with: tflab down --lab $LAB" || echo "tearing the lab down (KEEP=1 keeps it)"
