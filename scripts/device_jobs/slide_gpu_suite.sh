#!/usr/bin/env bash
# binaries: llama_cuda_gpu_tests
# seconds: 60
# The sliding engine's GPU suite alone ([sliding_gpu]: every placement the same bits, against
# the fp32 CPU trainer, within the budget, the loss on real text).
set -u
source scripts/device_jobs/job_lib.sh
export RUN_GREP="FAILED|passed|failed|test cases|^step  *[0-9]+: loss|^budget|^real text"
run sliding_gpu 60 "$BUILD/tests/llama_cuda/llama_cuda_gpu_tests" "[sliding_gpu]"
