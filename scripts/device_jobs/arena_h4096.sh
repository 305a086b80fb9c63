#!/usr/bin/env bash
# binaries: pipeline_bench gpt_train
# seconds: 400
# arena_judge.sh at h = 4096 only, with PyTorch's none and full recompute in the same call: for
# a card with less memory than the H200 (an H100's 80 GB does not hold the h = 8192 rows).
ARENA_WIDTHS=4096 ARENA_TORCH=1 JOB_DEADLINE_S=300 exec bash scripts/device_jobs/arena_judge.sh
