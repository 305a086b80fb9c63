#!/usr/bin/env bash
# binaries: gpu_tests cuda_consumer
# seconds: 150
# Issue 14: the Backend contract suite on the CUDA backend (gpu_tests "[contract]", the same
# assertions backend_tests runs on the CPU backend in CI), then the rest of gpu_tests (what only
# the CUDA backend does, the runtime's memory on it), then the consumer built against the
# INSTALLED package's CUDA targets (tests/package/cuda_consumer.cc: a 2-stage po-f pipeline on
# two CUDA backends, checked against the compiler's predictions). cuda_consumer exists once
# `ctest -R package_consumer` has run in the packed build (it installs and builds it there).
# Look for: "All tests passed" (the recycled-event case included, fixed on the CPU backend,
# which the CUDA backend passes too) and "cuda_consumer: 2 iterations of 2 stages on cuda:0".
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export TESTS_OUT="$LOG/backend_contract.txt"; : >"$TESTS_OUT"
export TESTS_GREP="cuda_consumer"
t 60 "$BUILD/tests/gpu/gpu_tests" "[contract]" --durations yes
t 60 "$BUILD/tests/gpu/gpu_tests" "~[contract]"
consumer=$(find "$BUILD" -name cuda_consumer -type f -perm -u+x | head -1)
if [[ -n "$consumer" ]]; then
  t 30 "$consumer"
else
  echo "== cuda_consumer: not packed (run ctest -R package_consumer in the build first)" | tee -a "$TESTS_OUT"
fi
rm -f "$LOG/part.txt"
