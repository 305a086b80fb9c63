#!/usr/bin/env bash
# binaries: pipeline_bench po-schedule gpt_train
# seconds: 560
# Issues 15 and 16 in one call.
#  1. Issue 15, V shapes against torch 2.11 itself: tests/python/torch_schedule_check.py (our
#     zbv / dualpipev CSVs pass torch's parser, _validate_schedule with a V stage-to-rank map and
#     its comms simulator; torch's own orders import and export to exactly our CSV).
#  2. gpt_train --backend cuda runs zbv and dualpipev now that it no longer refuses V: 2 stages
#     on the GPU, 30 steps each; the loss must fall.
#  3. Issue 16's Pareto bars with auto's per-entry mix of offload and recompute (po-f where the
#     link carries it, recompute where the peak stays above the budget): pipeline_bench, same
#     16 layers as docs/benchmarks.md's Pareto table (4 stages on the GPU, group-interleaved
#     v = 4 x 1 layer, seq 2048, m = 16): 1f1b, po-f and auto held to torch full recompute's
#     memory (0.71 GB at h = 4096, 1.68 GB at h = 8192, measured 2026-12-03), and auto held to
#     25% / 15% of 1f1b's stage-0 peak (the second bar).
#  4. torch_peer.py's none and full_recompute modes at both widths, same call.
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export NCCL_NVLS_ENABLE=0
export JOB_DEADLINE_S=520
echo "== torch_schedule_check"
timeout 90 python3 tests/python/torch_schedule_check.py "$BUILD/po-schedule" "$LOG/torch_csv" . \
  >"$LOG/torch_csv.log" 2>&1
echo "rc=$?"; tail -15 "$LOG/torch_csv.log"

source scripts/find_cublas.sh
po_find_cublas "$BUILD/bench/cuda/pipeline_bench"
gpt=$BUILD/examples/gpt/gpt_train
export RUN_GREP="^step +(1|10|20|30) |error|refus"
for family in zbv dualpipev; do
  run "gpt_$family" 60 "$gpt" --backend cuda --transport local --stages 2 --schedule "$family" \
    --embd 1024 --heads 16 --layers 8 --seq 512 --batch 2 --microbatches 8 --lr 3e-4 --steps 30
done

export RUN_GREP="mean step|auto: chose|\| (1f1b|po-f|auto) |error|FAILED"
common=(--model=gpt --seq=2048 --stages=4 --microbatches=16 --family=group-interleaved
        --chunks=4 --layers-per-chunk=1 --warmup=1 --out="$LOG/ours.md" --json="$LOG/ours.jsonl")
bench=$BUILD/bench/cuda/pipeline_bench
run "mix_h4096" 70 "$bench" "${common[@]}" --hidden=4096 --steps=3 --policies=1f1b,po-f,auto \
  --budget-gb=0.71
run "cut_h4096" 40 "$bench" "${common[@]}" --hidden=4096 --steps=3 --policies=1f1b,auto \
  --budget-fraction=0.25
run "mix_h8192" 110 "$bench" "${common[@]}" --hidden=8192 --steps=2 --policies=1f1b,po-f,auto \
  --budget-gb=1.68
run "cut_h8192" 70 "$bench" "${common[@]}" --hidden=8192 --steps=2 --policies=1f1b,auto \
  --budget-fraction=0.15
run "torch_peer" 110 python3 scripts/torch_peer.py --configs=4096:16,8192:16 --seq=2048 \
  --microbatches=16 --modes=none,full_recompute --warmup=1 --steps=2 --md="$LOG/torch.md" \
  --json="$LOG/peer.jsonl"
echo "--- torch"; cat "$LOG/torch.md" 2>/dev/null | head -20
