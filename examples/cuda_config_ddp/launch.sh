#!/usr/bin/env bash
# Two GPUs on one node.
export NCCL_DEBUG=WARN
torchrun --standalone --nproc_per_node=2 train.py --device cuda --dist-backend nccl --steps 20 "$@"
