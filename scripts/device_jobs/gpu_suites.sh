#!/usr/bin/env bash
# binaries: gpu_tests nccl_gpu_tests optim_gpu_tests optim_offload_tests gpt_kernels_gpu_tests gpt_cuda_gpu_tests gpt_cuda_train_gpu_tests
# seconds: 120
# Every gpu-labelled suite (deferred RELEASE, optimizer state dropped under offload, KernelScalars
# shared with the CUDA Adam, lean saved activations).
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export TESTS_OUT="$LOG/tests.txt"; : >"$TESTS_OUT"
t 60 "$BUILD/tests/gpu/gpu_tests"
t 40 "$BUILD/tests/gpu/nccl_gpu_tests"
t 60 "$BUILD/tests/optim/optim_offload_tests"
t 60 "$BUILD/tests/optim/cuda/optim_gpu_tests"
t 60 "$BUILD/tests/gpt_cuda/gpt_kernels_gpu_tests"
t 90 "$BUILD/tests/gpt_cuda/gpt_cuda_gpu_tests"
t 60 "$BUILD/tests/gpt_cuda_train/gpt_cuda_train_gpu_tests" --durations yes
rm -f "$LOG/part.txt"
