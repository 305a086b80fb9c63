#!/usr/bin/env bash
# binaries: llama_cuda_gpu_tests
# seconds: 120
# The fused loss at 1, 2, 3 chunks, Liger's rule and <= 20% of the logits, per phase, beside
# PyTorch's materialised loss (scripts/torch_ce_peer.py): where small chunks lose time (the dW
# GEMM's fp32 read-modify-write) and how many rows a chunk needs to keep it under the arithmetic.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=100
export RUN_GREP="FAILED|passed|failed|test cases|fused|phases|^\\||error|torch_ce_peer"
run ce_bench 60 "$BUILD/tests/llama_cuda/llama_cuda_gpu_tests" "[.llama_cuda_bench]"
export PYTHONUNBUFFERED=1
run torch_ce 60 python3 scripts/torch_ce_peer.py --json "$LOG/torch_ce.jsonl"
