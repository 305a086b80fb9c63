#!/usr/bin/env bash
# binaries: gpt_cuda_gpu_tests
# seconds: 170
# Chases the NaN of "GPU training steps track the CPU reference trainer" (gpt_cuda_gpu_tests,
# 2026-12-02 22:30 UTC: the GPU loss NaN from step 3, step 1 already 4.1e-4 off the CPU where it
# was 6.7e-5 on 2026-11-29): the case twice (deterministic?), then under compute-sanitizer's
# initcheck (reads of device memory nothing wrote) and memcheck.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=140
export RUN_GREP="FAILED|passed|failed|test cases|\\[train\\]|ERROR SUMMARY|Uninitialized|Invalid|at 0x|by thread|in .*Kernel|error"
T="$BUILD/tests/gpt_cuda/gpt_cuda_gpu_tests"
CASE="GPU training steps track the CPU reference trainer"
run train_a 30 "$T" "$CASE"
run train_b 30 "$T" "$CASE"
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [[ -n "$cs" ]]; then
  run initcheck 60 "$cs" --tool initcheck --print-limit 20 "$T" "$CASE"
  run memcheck 60 "$cs" --tool memcheck --print-limit 20 "$T" "$CASE"
else
  echo "gpt_cuda_nan: no compute-sanitizer on this machine"
fi
