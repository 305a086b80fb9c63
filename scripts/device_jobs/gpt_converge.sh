#!/usr/bin/env bash
# binaries: gpt_train gpt_cuda_train_gpu_tests
# seconds: 330
# Issue 16, "it must train": the labelled GPU test (C = 1024, 4 stages, po-f, 200 steps on the
# embedded corpus, below 0.6 x its unigram entropy), then the issue's own command line at
# C = 2048 (12 and 100 steps, warm-up and cosine decay by default, global-norm clipping 1) and
# C = 4096 (12 steps), one GPU, local transport. Look for: "[wide]" passed; the step lines'
# losses falling from ~6.1 with no jump (the issue saw 12.15 after one step at C = 2048 and
# 21.5 at C = 4096).
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export TESTS_OUT="$LOG/tests.txt"; : >"$TESTS_OUT"
export JOB_DEADLINE_S=280
t 120 "$BUILD/tests/gpt_cuda_train/gpt_cuda_train_gpu_tests" "[wide]" -s --durations yes
grep -E "step +[0-9]+ .*loss|loss .* norm|entropy" "$LOG/part.txt" | head -30
rm -f "$LOG/part.txt"
bin=$BUILD/examples/gpt/gpt_train
wide=(--backend cuda --transport local --stages 4 --chunks 1 --schedule 1f1b --embd 2048
      --heads 32 --layers 16 --seq 1024 --batch 2 --microbatches 8 --lr 3e-4)
export RUN_GREP="^step|^optimizer|error"
run c2048_12 120 "$bin" "${wide[@]}" --steps 12
run c2048_100 150 "$bin" "${wide[@]}" --steps 100
run c4096_12 120 "$bin" --backend cuda --transport local --stages 4 --chunks 1 --schedule 1f1b \
  --embd 4096 --heads 64 --layers 8 --seq 1024 --batch 2 --microbatches 8 --lr 1.2e-4 --steps 12
