#!/usr/bin/env bash
# binaries: pipeline_bench
# seconds: 240
# What the chunk order costs on one GPU without offload (issue 16's +3% bar): the one-layer
# group-interleaved order ran 2.4% above 1F1B with its stages waiting 4x longer, so this runs
# the same 16 layers (4 stages on the GPU, seq 2048, m = 16, 3 timed steps) as 1f1b and as
# "none" on each order of ORDER_LAYOUTS (default: group-interleaved and interleaved at v = 4 and
# v = 2, 4 / v layers per chunk), at ORDER_WIDTH (4096), one pipeline_bench run per order.
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-200}
source scripts/find_cublas.sh
po_find_cublas "$BUILD/bench/cuda/pipeline_bench"
export RUN_GREP="pipeline_bench: h=|\| (1f1b|none) |GPU busy|error|FAILED"
h=${ORDER_WIDTH:-4096}
policies=1f1b,none  # 1f1b once, with the first order; "none" alone after it
layouts="group-interleaved:4 interleaved:4 group-interleaved:2 interleaved:2"
for order in ${ORDER_LAYOUTS:-$layouts}; do
  family=${order%:*} v=${order#*:}
  [[ $v == 1 || $v == 2 || $v == 4 ]] ||
    { echo "ORDER_LAYOUTS: v = $v does not divide the 4 layers of a stage"; exit 2; }
  run "order_${family}_v$v" 120 "$BUILD/bench/cuda/pipeline_bench" --model=gpt --seq=2048 \
    --stages=4 --microbatches=16 --family="$family" --chunks="$v" --layers-per-chunk=$((4 / v)) \
    --hidden="$h" --warmup=1 --steps=3 --wait-timeout=30 --policies="$policies" \
    --out="$LOG/orders.md" --json="$LOG/orders.jsonl"
  policies=none
done
echo "--- orders ($LOG/orders.md)"
grep -E "^\| (1f1b|none) " "$LOG/orders.md" 2>/dev/null
