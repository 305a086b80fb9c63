#!/usr/bin/env bash
# binaries: gpt_cuda_perf_bench
# seconds: 30
# One layer's F / B / W, lean vs full saved activations, h = 4096, T = 2048 (timing only).
set -uo pipefail
timeout 28 "$BUILD/bench/cuda/gpt_cuda_perf_bench" "[gpt_cuda_perf_lean]" 2>&1 | tail -30
