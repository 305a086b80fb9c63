#!/usr/bin/env bash
# binaries: pipeline_bench
# seconds: 150
# h = 2048 (transfer-bound): auto at budget 0.5 and 0.6 of 1f1b's largest peak, po-f, full and
# lean saved activations; then the checklist over these rows.
set -uo pipefail
export GPT_BENCH_CONFIGS="2048 70 --chunks=4 --layers-per-chunk=4 --policies=1f1b,auto,po-f --budget-fraction=0.6 64
2048 70 --saved=lean --chunks=4 --layers-per-chunk=4 --policies=1f1b,auto,po-f --budget-fraction=0.5 64"
export GPT_BENCH_PEER_ONLY=1
export GPT_BENCH_DEADLINE_S=120 GPT_BENCH_HARD_S=140
OUT="$LOG" bash scripts/device_gpt_bench.sh "$BUILD" 2>&1 | tail -40
