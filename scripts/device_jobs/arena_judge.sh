#!/usr/bin/env bash
# binaries: pipeline_bench gpt_train
# seconds: 560
# Issues 15 and 16, after the arena's two-ended carving, auto's one-GPU judge and V placement in
# the chunk-time measurement:
#  1. gpt_train --backend cuda runs zbv and dualpipev (the refusal is gone): 2 stages on the
#     GPU, 30 steps each; the loss must fall.
#  2. At each width of ARENA_WIDTHS (default "4096 8192"): 1f1b, po-f and auto at 25% (h = 4096)
#     / 15% (h = 8192) of 1f1b's stage-0 peak, then auto held to torch full recompute's memory
#     (0.71 / 1.68 GB), both ranked by the one-GPU step (SimulateSharedGpu).
#  3. With ARENA_TORCH=1, scripts/torch_peer.py's none and full_recompute at the same widths,
#     so the bars are read on one card (arena_h4096.sh, arena_h8192.sh).
# A run that would start past JOB_DEADLINE_S is skipped (job_lib.sh).
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export NCCL_NVLS_ENABLE=0
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-440}
source scripts/find_cublas.sh
po_find_cublas "$BUILD/bench/cuda/pipeline_bench"
gpt=$BUILD/examples/gpt/gpt_train
export RUN_GREP="^step +(1|10|20|30) |error|refus"
for family in zbv dualpipev; do
  run "gpt_$family" 60 "$gpt" --backend cuda --transport local --stages 2 --schedule "$family" \
    --embd 1024 --heads 16 --layers 8 --seq 512 --batch 2 --microbatches 8 --lr 3e-4 --steps 30
done
export RUN_GREP="mean step|auto: chose|\| (1f1b|po-f|auto|torch) |error|FAILED"
common=(--model=gpt --seq=2048 --stages=4 --microbatches=16 --family=group-interleaved
        --chunks=4 --layers-per-chunk=1 --warmup=1 --out="$LOG/ours.md" --json="$LOG/ours.jsonl")
bench=$BUILD/bench/cuda/pipeline_bench
for h in ${ARENA_WIDTHS:-4096 8192}; do
  # Per width: timed steps, the cut's budget fraction, torch full recompute's activations (GB).
  steps=2 fraction=0.15 torch_gb=1.68
  [[ $h == 4096 ]] && steps=3 fraction=0.25 torch_gb=0.71
  run "cut_h$h" 150 "$bench" "${common[@]}" --hidden="$h" --steps="$steps" \
    --policies=1f1b,po-f,auto --budget-fraction="$fraction"
  run "mix_h$h" 110 "$bench" "${common[@]}" --hidden="$h" --steps="$steps" --policies=auto \
    --budget-gb="$torch_gb"
  if [[ ${ARENA_TORCH:-0} == 1 ]]; then
    run "torch_h$h" 120 python3 scripts/torch_peer.py --configs="$h:16" --seq=2048 \
      --microbatches=16 --modes=none,full_recompute --warmup=1 --steps="$steps" \
      --md="$LOG/torch.md" --json="$LOG/peer.jsonl"
  fi
done
echo "--- ours ($LOG/ours.md)"
head -40 "$LOG/ours.md" 2>/dev/null
echo "--- torch ($LOG/torch.md)"
head -20 "$LOG/torch.md" 2>/dev/null
