#!/usr/bin/env bash
# binaries: pipeline_bench
# seconds: 480
# Issue 5's full table in one device call: scripts/device_gpt_bench.sh with its defaults (the
# five policies 1f1b, po-h, po-f, selective, auto at h = 8192, 4096, 2048; the PyTorch peer at
# h = 4096; the checklist), arenas sized by the P2P lifetimes (the default). Pack it with
# gpu_suites.sh:  scripts/device_batch.sh --pack build-batch .device-next \
#   scripts/device_jobs/gpu_suites.sh scripts/device_jobs/issue5_full_table.sh
set -uo pipefail
OUT="$LOG" bash scripts/device_gpt_bench.sh "$BUILD" 2>&1 | tail -60
