#!/usr/bin/env bash
# binaries: gpt_cuda_gpu_tests pipeline_bench
# seconds: 420
# Issue 16, "Pareto against every PyTorch memory option": one run prints the whole table.
#  1. The CUDA GPT's recompute against keeping every entry (gpt_cuda_gpu_tests
#     "[gpt_cuda_recompute]": full bitwise, lean bitwise but the GELU slots and the fc-proj
#     weight gradients, within bounds) and the lean layout it builds on ("[gpt_cuda_lean]").
#  2. pipeline_bench, 4 stages on the GPU, 16 layers (group-interleaved v = 4 x 1 layer), seq
#     2048, m = 16 at h = 4096 and 8192: 1f1b (no offload), po-f, recompute-full,
#     recompute-lean and auto held to torch full recompute's activation memory (the issue's
#     0.93 / 2.12 GB: auto may keep, offload or recompute each entry); each row has the step and
#     stage 0's activation peak (logical / physical stash).
#  3. scripts/torch_peer.py's same 16 layers in PyTorch's four modes: none, full_recompute
#     (checkpoint per layer), attention_recompute (the attention branch checkpointed),
#     save_on_cpu (one timed step: ~26 s at h = 8192); peak = activations of the whole model.
#  4. the second bar's point: 1f1b and auto held to 15% (h = 8192) / 25% (h = 4096) of 1f1b's
#     stage-0 peak, whose step must stay within 1f1b's + 3%.
#  5. pipeline_bench --summarize joins every run into one table ($LOG/pareto.md).
# The bars (the issue's): at torch full recompute's memory, >= 15% faster than it at both
# widths; at our no-offload step + 3%, stage 0's activations cut >= 85% at h = 8192, >= 75% at
# h = 4096. Steps: 3 timed at h = 4096, 2 at h = 8192 (one warm-up each), to fit the time.
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export TESTS_OUT="$LOG/tests.txt"; : >"$TESTS_OUT"
export NCCL_NVLS_ENABLE=0
t 60 "$BUILD/tests/gpt_cuda/gpt_cuda_gpu_tests" "[gpt_cuda_recompute],[gpt_cuda_lean]" -s
grep -hE "^\[recompute\]|^\[lean\]|fcproj" "$LOG/part.txt" | head -12
rm -f "$LOG/part.txt"

source scripts/find_cublas.sh
po_find_cublas "$BUILD/bench/cuda/pipeline_bench"
export JOB_DEADLINE_S=390
export RUN_GREP="mean step|step time|\| (1f1b|po-f|recompute|auto|torch)|auto: chose|error|FAILED"
common=(--model=gpt --seq=2048 --stages=4 --microbatches=16 --family=group-interleaved
        --chunks=4 --layers-per-chunk=1 --warmup=1 --out="$LOG/ours.md" --json="$LOG/ours.jsonl")
run "ours_h4096" 80 "$BUILD/bench/cuda/pipeline_bench" "${common[@]}" --hidden=4096 --steps=3 \
  --policies=1f1b,po-f,recompute-full,recompute-lean,auto --budget-gb=0.93
run "ours_h8192" 120 "$BUILD/bench/cuda/pipeline_bench" "${common[@]}" --hidden=8192 --steps=2 \
  --policies=1f1b,po-f,recompute-full,recompute-lean,auto --budget-gb=2.12
run "torch_peer" 170 python3 scripts/torch_peer.py --configs=4096:16,8192:16 --seq=2048 \
  --microbatches=16 --modes=none,full_recompute,attention_recompute,save_on_cpu --warmup=1 \
  --steps=2 --offload-steps=1 --md="$LOG/torch.md" --json="$LOG/peer.jsonl"
run "cut_h8192" 60 "$BUILD/bench/cuda/pipeline_bench" "${common[@]}" --hidden=8192 --steps=2 \
  --policies=1f1b,auto --budget-fraction=0.15
run "cut_h4096" 40 "$BUILD/bench/cuda/pipeline_bench" "${common[@]}" --hidden=4096 --steps=3 \
  --policies=1f1b,auto --budget-fraction=0.25
"$BUILD/bench/cuda/pipeline_bench" --summarize="$LOG/ours.jsonl" --peer="$LOG/peer.jsonl" \
  --out="$LOG/pareto.md" >/dev/null 2>"$LOG/summarize.err" || cat "$LOG/summarize.err"
echo "--- ours ($LOG/ours.md)"
head -60 "$LOG/ours.md" 2>/dev/null
echo "--- torch ($LOG/torch.md)"
cat "$LOG/torch.md" 2>/dev/null | head -30
echo "--- joined ($LOG/pareto.md)"
head -40 "$LOG/pareto.md" 2>/dev/null
