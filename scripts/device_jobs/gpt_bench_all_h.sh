#!/usr/bin/env bash
# binaries: pipeline_bench
# seconds: 280
# Issue 5 after the deferred RELEASE capped at the predicted stash peak (the default): h = 8192
# (full and lean saved activations), 4096, 2048 through scripts/device_gpt_bench.sh; the PyTorch
# peer is skipped (measured at 14:35 UTC the same day, same machine: none 1.177 s, 4.55 GB;
# save_on_cpu 8.382 s, 0.42 GB).
set -uo pipefail
export GPT_BENCH_CONFIGS="8192 100 --chunks=4 --layers-per-chunk=1 --policies=1f1b,po-f --sim-tolerance=0.025 16
8192 100 --saved=lean --chunks=4 --layers-per-chunk=1 --policies=1f1b,po-f --sim-tolerance=0.025 16
4096 60 --chunks=4 --layers-per-chunk=1 --policies=1f1b,po-h,po-f 16
2048 70 --chunks=4 --layers-per-chunk=4 --policies=1f1b,auto,po-f --budget-fraction=0.5 64"
export GPT_BENCH_PEER_ONLY=1
export GPT_BENCH_DEADLINE_S=240 GPT_BENCH_HARD_S=262
OUT="$LOG" bash scripts/device_gpt_bench.sh "$BUILD" 2>&1 | tail -60
