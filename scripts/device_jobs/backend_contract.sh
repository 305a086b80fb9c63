#!/usr/bin/env bash
# binaries: gpu_tests cuda_consumer
# seconds: 150
# Issue 14: the Backend contract suite on the CUDA backend (gpu_tests "[contract]", the same
# assertions backend_tests runs on the CPU backend in CI), then the rest of gpu_tests (what only
# the CUDA backend does, the runtime's memory on it), then the consumer built against the
# INSTALLED package's CUDA targets (tests/package/cuda_consumer.cc: a 2-stage po-f pipeline on
# two CUDA backends, checked against the compiler's predictions). cuda_consumer exists once
# `ctest -R package_consumer` has run in the packed build (it installs and builds it there).
# Look for: "All tests passed" / "1 failed as expected" (the [!mayfail] recycled-event case,
# which the CUDA backend should pass) and "cuda_consumer: 2 iterations of 2 stages on cuda:0".
set -uo pipefail
out="$LOG/backend_contract.txt"; : >"$out"
t() {  # t LIMIT BINARY ARGS...
  local limit=$1; shift
  echo "== $(date -u +%T) $(basename "$1") ${*:2}" | tee -a "$out"
  timeout "$limit" "$@" >"$LOG/part.txt" 2>&1; local rc=$?
  head -c 60000 "$LOG/part.txt" >>"$out"
  echo "rc=$rc" | tee -a "$out"
  grep -E "FAILED|passed|failed|test cases|cuda_consumer" "$LOG/part.txt" | tail -6
}
t 60 "$BUILD/tests/gpu/gpu_tests" "[contract]" --durations yes
t 60 "$BUILD/tests/gpu/gpu_tests" "~[contract]"
consumer=$(find "$BUILD" -name cuda_consumer -type f -perm -u+x | head -1)
if [[ -n "$consumer" ]]; then
  t 30 "$consumer"
else
  echo "== cuda_consumer: not packed (run ctest -R package_consumer in the build first)" | tee -a "$out"
fi
rm -f "$LOG/part.txt"
