#!/usr/bin/env bash
# Launch TinyGPT training on the 2 GPUs of one node.
set -euo pipefail
cd "$(dirname "$0")"

export CUDA_VISIBLE_DEVICES=0,1
export NCCL_DEBUG=WARN
export NCCL_IB_DISABLE=1
export NCCL_P2P_LEVEL=NVL
export CUDA_LAUNCH_BLOCKING=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export OMP_NUM_THREADS=4

torchrun --standalone --nproc_per_node=2 train.py --amp --steps "${STEPS:-200}" "$@"
