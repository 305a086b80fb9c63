#!/usr/bin/env bash
# binaries: gpu_tests optim_gpu_tests gpt_kernels_gpu_tests gpt_cuda_gpu_tests llama_cuda_gpu_tests
# seconds: 500
# Issue 17: compute-sanitizer over the GPU suites. memcheck (out-of-bounds and misaligned
# device accesses, bad frees, errors of CUDA calls) over the backend and stash suite, the GPU
# Adam, the GPT kernels, the CUDA GPT's layers and the Llama kernels; racecheck (shared-memory
# hazards) over the suites whose kernels use shared memory: the GPT kernels (layernorm,
# attention, cross-entropy reductions), flash attention and the GPU Adam. The training cases
# are left out (a model per case, minutes under the tools); gpt_cuda_nan_fix.sh runs memcheck
# and initcheck over the GPT training case. Each run has its own limit and the job skips what
# would start past 450 s; the last lines sum up each tool's errors over the runs that finished,
# and name the runs that did not (a time limit, a crash): those are no evidence either way.
# Exit status 0 only when every run finished with 0 errors and its tests passed.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=450
export RUN_GREP="FAILED|passed|failed|test cases|ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|\
hazard|by thread|in .*Kernel"
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null |
  head -1)
if [[ -z "$cs" ]]; then
  echo "compute_sanitizer: no compute-sanitizer on this machine"
  exit 1
fi
"$cs" --version | tail -1
T=$BUILD/tests
# One tool over one suite: `check TOOL NAME LIMIT BINARY ARGS...` (its log is $LOG/NAME.log).
names=()
check() {
  local tool=$1 name=$2 limit=$3; shift 3
  names+=("$tool:$name")
  run "$name" "$limit" "$cs" --tool "$tool" --print-limit 20 "$@"
}
check memcheck mem_gpu 80 "$T/gpu/gpu_tests"
check memcheck mem_adam 80 "$T/optim/cuda/optim_gpu_tests" "[gpuadam][kernel]"
check memcheck mem_gpt_kernels 50 "$T/gpt_cuda/gpt_kernels_gpu_tests"
check memcheck mem_gpt_layers 60 "$T/gpt_cuda/gpt_cuda_gpu_tests" \
  "[gpt_cuda_linear],[gpt_cuda_stack],[gpt_cuda_lean]"
check memcheck mem_llama 60 "$T/llama_cuda/llama_cuda_gpu_tests" "[flash],[llama_cuda][units]"
check racecheck race_gpt_kernels 50 "$T/gpt_cuda/gpt_kernels_gpu_tests"
check racecheck race_flash 110 "$T/llama_cuda/llama_cuda_gpu_tests" "[flash]"
check racecheck race_adam 80 "$T/optim/cuda/optim_gpu_tests" "[gpuadam][kernel]"

# The sums. memcheck ends with "ERROR SUMMARY: N errors", racecheck with "RACECHECK SUMMARY: N
# hazards displayed (E errors, W warnings)"; a log without its summary did not finish. Catch's
# "test cases: ... failed" means a test failed under the tool.
declare -A errors=([memcheck]=0 [racecheck]=0)
unfinished=() failed_tests=()
for entry in "${names[@]}"; do
  tool=${entry%%:*} name=${entry#*:} log="$LOG/${entry#*:}.log"
  if [[ "$tool" == memcheck ]]; then
    n=$(grep -oE "ERROR SUMMARY: [0-9]+" "$log" 2>/dev/null | tail -1 | grep -oE "[0-9]+$")
  else
    n=$(grep -oE "RACECHECK SUMMARY: [0-9]+ hazards displayed \([0-9]+ errors" "$log" \
      2>/dev/null | tail -1 | grep -oE "[0-9]+ errors" | grep -oE "[0-9]+")
  fi
  if [[ -z "$n" ]]; then
    unfinished+=("$name")
    continue
  fi
  errors[$tool]=$((errors[$tool] + n))
  grep -qE "test cases:.*failed|FAILED" "$log" && failed_tests+=("$name")
done
echo "compute_sanitizer: memcheck ${errors[memcheck]} errors, racecheck ${errors[racecheck]}" \
  "errors (runs that finished)"
echo "compute_sanitizer: unfinished: ${unfinished[*]:-none}; tests failed: ${failed_tests[*]:-none}"
((errors[memcheck] == 0 && errors[racecheck] == 0 && ${#unfinished[@]} == 0 &&
  ${#failed_tests[@]} == 0))
