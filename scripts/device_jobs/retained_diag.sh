#!/usr/bin/env bash
# binaries: pipeline_bench gpt_train gpt_cuda_gpu_tests
# seconds: 100
# Why a plan whose retained blocks are offloaded stops on the GPU (retained_offload.sh's
# recompute-lean+po-f and auto runs at h = 4096 passed their 120 s limit with no error): the
# same policy at a small width under pipeline_bench and gpt_train, each stopped after
# DIAG_WAIT_S with every thread's stack (gdb, when the machine has it) in $LOG/NAME.bt; then
# the GPU test of the combination alone.
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export NCCL_NVLS_ENABLE=0
source scripts/find_cublas.sh
po_find_cublas "$BUILD/bench/cuda/pipeline_bench"
wait_s=${DIAG_WAIT_S:-30}
# stacked NAME ARGS...: runs ARGS in the background; past wait_s, dumps its stacks and stops it.
stacked() {
  local name=$1; shift
  echo "== $name: $*"
  "$@" >"$LOG/$name.log" 2>&1 &
  local pid=$! start=$SECONDS
  while kill -0 "$pid" 2>/dev/null && ((SECONDS - start < wait_s)); do sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "still running after $wait_s s: stacks in $name.bt"
    if command -v gdb >/dev/null; then
      timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt 30" >"$LOG/$name.bt" 2>&1
    else
      for task in /proc/$pid/task/*; do
        echo "--- $task: $(cat "$task/comm") $(cat "$task/wchan" 2>/dev/null)"
        cat "$task/stack" 2>/dev/null
      done >"$LOG/$name.bt"
    fi
    kill -9 "$pid"
  fi
  wait "$pid"; echo "rc=$? ($((SECONDS - start)) s)"
  grep -E "mean step|error|Error|stuck|FAILED|auto: chose" "$LOG/$name.log" | cut -c1-300 | head -8
}
common=(--model=gpt --seq=512 --stages=4 --microbatches=8 --family=group-interleaved --chunks=2
        --layers-per-chunk=1 --warmup=1 --steps=2 --hidden=1024 --wait-timeout=15)
stacked bench_lean_pof "$BUILD/bench/cuda/pipeline_bench" "${common[@]}" \
  --policies=recompute-lean,recompute-lean+po-f
stacked train_lean_pof "$BUILD/examples/gpt/gpt_train" --backend cuda --transport local \
  --stages 2 --schedule po-f --recompute lean --embd 512 --heads 8 --layers 4 --seq 256 \
  --batch 2 --microbatches 8 --steps 3 --watchdog 20
stacked gpu_test "$BUILD/tests/gpt_cuda/gpt_cuda_gpu_tests" \
  "recompute with po-f on one GPU*"
for f in "$LOG"/*.bt; do
  [[ -f $f ]] || continue
  echo "--- $f"; grep -E "^Thread|^#[0-9]+ " "$f" | grep -vE "in (start_thread|clone|__GI)" | cut -c1-200 | head -80
done
