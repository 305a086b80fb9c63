#!/usr/bin/env bash
# binaries: pipeline_bench
# seconds: 150
# pipeline_bench's short run (scripts/device_gpt_bench.sh --quick: h = 4096, the checklist's
# policies, the peer with 4 layers), e.g. to check a change to how the bench measures its costs.
set -uo pipefail
OUT="$LOG" bash scripts/device_gpt_bench.sh "$BUILD" --quick 2>&1 | tail -30
