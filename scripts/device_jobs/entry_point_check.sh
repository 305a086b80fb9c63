#!/usr/bin/env bash
# binaries: gpt_train
# seconds: 200
# After gpt_train, pipeline_bench and the one-GPU rig moved onto PipelineStage / LocalPipeline
# (pipeline.h, issue 14): gpt_train on one GPU over the local transport at h = 4096 (p = 4, 16
# layers, v = 4, m = 16) without offload and with po-f, planned on measured costs, as
# measured_costs_2gpu.sh ran it before the port (po-f +2.2% for a 30% cut on 2026-11-29).
# Run it beside gpu_suites.sh (the ported trainer's GPU tests) and bench_quick.sh (pipeline_bench).
set -uo pipefail
train="$BUILD/examples/gpt/gpt_train"
JOB_DEADLINE_S=180
source scripts/device_jobs/job_lib.sh
one=("$train" --transport local --backend cuda --stages 4 --embd 4096 --layers 16 --chunks 4
     --seq 2048 --batch 1 --microbatches 16 --lr 0.0003 --steps 4 --watchdog 300)
run 1gpu_h4096_gi 80 "${one[@]}" --schedule group-interleaved
run 1gpu_h4096_pof 80 "${one[@]}" --schedule po-f
