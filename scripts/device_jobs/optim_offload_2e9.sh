#!/usr/bin/env bash
# binaries: optim_offload_bench
# seconds: 170
# Issue 6: the round-robin update-phase benchmark with the 3-point rate fit, 2e9 params.
set -u
timeout 165 "$BUILD/bench/optim/cuda/optim_offload_bench" --params=2e9 --steps=3 2>&1 | tee "$LOG/bench_2e9.md"
