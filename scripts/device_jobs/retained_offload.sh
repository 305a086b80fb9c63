#!/usr/bin/env bash
# binaries: pipeline_bench gpt_cuda_gpu_tests
# seconds: 560
# Issue 16's lever, recompute and offload what F keeps (a recomputed entry's retained block
# goes to the host and back before its RECOMPUTE*), and the one-GPU reload margin of one real
# B, on the GPU:
#  1. gpt_cuda_gpu_tests "[gpt_cuda_recompute]": recompute with po-f on one GPU ends with the
#     bits of recompute alone, peaks as predicted (with RETAINED_TESTS=1; the other cases of the
#     tag come with it).
#  2. At each width of RETAINED_WIDTHS (default "4096"): pipeline_bench 1f1b, po-f,
#     recompute-lean+po-f, auto at 25% (h = 4096) / 15% (h = 8192) of 1f1b's stage-0 peak (the
#     +3% bar's point; RETAINED_CUT sets these policies), auto at torch full recompute's memory
#     (0.71 / 1.68 GB; RETAINED_MIX sets its policies, e.g. "auto,auto:shared"); then
#     torch_peer.py none and full_recompute in the same call (RETAINED_TORCH=0 skips it), so the
#     bars are read on one card. RETAINED_FRACTIONS="0.3 0.35" / RETAINED_GBS="0.8 0.9" add
#     auto alone at those budgets.
# Same 16 layers as the Pareto table: 4 stages on the GPU, group-interleaved v = 4 x 1 layer
# (RETAINED_V="4 2" runs the cut and mix rows at each v of 1, 2 and 4, with 4 / v layers per
# chunk: auto is held to the rigs' v, and the one-layer order costs time of its own; the
# RETAINED_FRACTIONS / RETAINED_GBS rows stay at v = 4), seq 2048, m = 16; 3 timed steps at
# h = 4096, 2 at 8192, one warm-up. A run that would start past JOB_DEADLINE_S is skipped
# (job_lib.sh).
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export NCCL_NVLS_ENABLE=0
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-450}
if [[ ${RETAINED_TESTS:-0} == 1 ]]; then
  export TESTS_OUT="$LOG/tests.txt"; : >"$TESTS_OUT"
  # Without -s: its output of the older recompute cases is large enough to slow the run.
  t 150 "$BUILD/tests/gpt_cuda/gpt_cuda_gpu_tests" "[gpt_cuda_recompute]" --durations yes
  rm -f "$LOG/part.txt"
fi
for v in ${RETAINED_V:-4}; do
  [[ $v == 1 || $v == 2 || $v == 4 ]] ||
    { echo "RETAINED_V: $v does not divide the 4 layers of a stage"; exit 2; }
done
source scripts/find_cublas.sh
po_find_cublas "$BUILD/bench/cuda/pipeline_bench"
bench=$BUILD/bench/cuda/pipeline_bench
export RUN_GREP="pipeline_bench: h=|mean step|auto: chose|\| (1f1b|po-f|recompute|auto|torch) |error|FAILED"
common=(--model=gpt --seq=2048 --stages=4 --microbatches=16 --family=group-interleaved
        --warmup=1 --wait-timeout=30 --out="$LOG/ours.md" --json="$LOG/ours.jsonl")
for h in ${RETAINED_WIDTHS:-4096}; do
  # Per width: timed steps, the cut's budget fraction, torch full recompute's activations (GB).
  steps=2 fraction=0.15 torch_gb=1.68 limit=200
  [[ $h == 4096 ]] && steps=3 fraction=0.25 torch_gb=0.71 limit=120
  for v in ${RETAINED_V:-4}; do
    layout=(--chunks="$v" --layers-per-chunk=$((4 / v)))
    tag=$h; [[ $v == 4 ]] || tag="${h}_v$v"
    run "cut_h$tag" "$limit" "$bench" "${common[@]}" "${layout[@]}" --hidden="$h" \
      --steps="$steps" --policies="${RETAINED_CUT:-1f1b,po-f,recompute-lean+po-f,auto}" \
      --budget-fraction="$fraction"
    run "mix_h$tag" "$limit" "$bench" "${common[@]}" "${layout[@]}" --hidden="$h" \
      --steps="$steps" --policies="${RETAINED_MIX:-auto}" --budget-gb="$torch_gb"
  done
  layout=(--chunks=4 --layers-per-chunk=1)
  # More budget points for auto alone (the planner's budget is the logical stash; where B reads
  # lean blocks in place the device holds less, so a looser budget may still land under a bar).
  for extra in ${RETAINED_FRACTIONS:-}; do
    run "cut_h${h}_$extra" "$limit" "$bench" "${common[@]}" "${layout[@]}" --hidden="$h" --steps="$steps" \
      --policies=auto --budget-fraction="$extra"
  done
  for extra in ${RETAINED_GBS:-}; do
    run "mix_h${h}_$extra" "$limit" "$bench" "${common[@]}" "${layout[@]}" --hidden="$h" --steps="$steps" \
      --policies=auto --budget-gb="$extra"
  done
  [[ ${RETAINED_TORCH:-1} == 1 ]] && run "torch_h$h" 120 python3 scripts/torch_peer.py --configs="$h:16" --seq=2048 \
    --microbatches=16 --modes=none,full_recompute --warmup=1 --steps="$steps" \
    --md="$LOG/torch.md" --json="$LOG/peer.jsonl"
done
echo "--- ours ($LOG/ours.md)"
head -40 "$LOG/ours.md" 2>/dev/null
# RETAINED_TORCH=0 leaves no torch table: not a failure of the job.
if [[ -f "$LOG/torch.md" ]]; then
  echo "--- torch ($LOG/torch.md)"
  head -20 "$LOG/torch.md"
fi
