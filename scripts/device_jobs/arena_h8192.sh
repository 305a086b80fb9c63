#!/usr/bin/env bash
# binaries: pipeline_bench gpt_train
# seconds: 480
# arena_judge.sh at h = 8192 only, with PyTorch's none and full recompute in the same call (run
# it on the H200: 16 layers of h = 8192 on four stages need more than an H100's 80 GB).
ARENA_WIDTHS=8192 ARENA_TORCH=1 JOB_DEADLINE_S=340 exec bash scripts/device_jobs/arena_judge.sh
