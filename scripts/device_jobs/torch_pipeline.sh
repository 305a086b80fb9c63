#!/usr/bin/env bash
# binaries:
# libraries: po_c_api
# seconds: 420
# Issue 14, PyTorch: pipeoffload.torch on one GPU. The torch suite (tests/python_torch: a 4-stage
# toy pipeline trained with 1f1b / group-interleaved, with and without po-h / po-f offload, bitwise
# equal; activation memory vs the prediction; pinned buffer reuse), then the step-time benchmark
# (scripts/torch_pipeline_bench.py: our schedule none / po-h / po-f beside a plain loop and torch's
# ScheduleLoopedBFS; TORCH_BENCH=0 skips it). libpipeoffload_c.so and its libabsl_* come from
# the pack ($BUILD/lib). Exit status: the suite's (the benchmark's when the suite passed).
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD/python
export PIPEOFFLOAD_LIBRARY=$BUILD/lib/libpipeoffload_c.so CUBLAS_WORKSPACE_CONFIG=:4096:8
python3 -c "import torch, pipeoffload; print('torch', torch.__version__, 'pipeoffload', pipeoffload.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee "$LOG/versions.txt"
timeout 240 python3 tests/python_torch/run_torch_tests.py 2>&1 | tee "$LOG/tests.log" | grep -E "^(PASS|FAIL|OK|FAILED|skipped)|Error|error"
tests_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc"
[[ ${TORCH_BENCH:-1} == 1 ]] || exit "$tests_rc"
timeout 150 python3 scripts/torch_pipeline_bench.py --json "$LOG/bench.json" \
  --markdown "$LOG/bench.md" 2>&1 | tee "$LOG/bench.log" | tail -12
bench_rc=${PIPESTATUS[0]}
((tests_rc != 0)) && exit "$tests_rc"
exit "$bench_rc"
