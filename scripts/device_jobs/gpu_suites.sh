#!/usr/bin/env bash
# binaries: gpu_tests nccl_gpu_tests optim_gpu_tests optim_cuda_cpu_tests gpt_kernels_gpu_tests gpt_cuda_gpu_tests gpt_cuda_train_gpu_tests
# seconds: 120
# Every gpu-labelled suite (deferred RELEASE, optimizer state dropped under offload, KernelScalars
# shared with the CUDA Adam, lean saved activations).
set -uo pipefail
out="$LOG/tests.txt"; : >"$out"
t() {  # t LIMIT BINARY ARGS...
  local limit=$1; shift
  echo "== $(date -u +%T) $(basename "$1") ${*:2}" | tee -a "$out"
  timeout "$limit" "$@" >"$LOG/part.txt" 2>&1; local rc=$?
  head -c 60000 "$LOG/part.txt" >>"$out"
  echo "rc=$rc" | tee -a "$out"
  grep -E "FAILED|passed|failed|test cases" "$LOG/part.txt" | tail -6
}
t 60 "$BUILD/tests/gpu/gpu_tests"
t 40 "$BUILD/tests/gpu/nccl_gpu_tests"
t 60 "$BUILD/tests/optim/cuda/optim_cuda_cpu_tests"
t 60 "$BUILD/tests/optim/cuda/optim_gpu_tests"
t 60 "$BUILD/tests/gpt_cuda/gpt_kernels_gpu_tests"
t 90 "$BUILD/tests/gpt_cuda/gpt_cuda_gpu_tests"
t 60 "$BUILD/tests/gpt_cuda_train/gpt_cuda_train_gpu_tests" --durations yes
rm -f "$LOG/part.txt"
