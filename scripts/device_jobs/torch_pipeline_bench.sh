#!/usr/bin/env bash
# binaries:
# libraries: po_c_api
# seconds: 160
# The benchmark half of torch_pipeline.sh alone (its tests passed on 2026-12-02): our schedule
# none / po-h / po-f on torch stages beside a plain loop and torch's own ScheduleLoopedBFS.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD/python
export PIPEOFFLOAD_LIBRARY=$BUILD/lib/libpipeoffload_c.so CUBLAS_WORKSPACE_CONFIG=:4096:8
timeout 150 python3 scripts/torch_pipeline_bench.py --json "$LOG/bench.json" \
  --markdown "$LOG/bench.md" 2>&1 | tee "$LOG/bench.log" | tail -14
echo "bench rc=${PIPESTATUS[0]}"
