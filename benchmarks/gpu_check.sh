#!/usr/bin/env bash
# graphbisect on ONNX Runtime's CUDA execution provider (a machine with an NVIDIA GPU and onnxruntime-gpu):
# compare, reduce, passes and precision on the example and the LayerNorm test models, one table.
# See benchmarks/gpu_check.py; record its output in benchmarks/README.md ("CUDA EP") when a GPU is at hand.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no NVIDIA GPU here (nvidia-smi finds none): nothing to check"
  exit 0
fi
nvidia-smi -L
exec python gpu_check.py "$@"
