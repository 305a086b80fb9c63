#!/usr/bin/env bash
# binaries: llama_cuda_gpu_tests optim_gpu_tests slide_train cpu_adam_bench
# seconds: 340
# Issue 13 after the split master (adam.h's SplitMaster: a bf16 model's fp32 master kept as its
# bf16 high half, the parameter, and a 16-bit low half): the sliding engine's GPU suite (every
# placement the same bits), the GPU Adam on split spans, CPU Adam fp32 vs split masters on the
# host, the drive's bandwidth through --dry-run, and Llama-3-8B in 24 GiB at 8 and 16 x 2048
# (untraced: the headline numbers). JSON in slide.jsonl.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-250}
export RUN_GREP="FAILED|passed|failed|test cases|^step  *[0-9]+: loss|^budget|^real text|^\\| cpu_adam|^\\| [0-9]|^(placement|ring|device|host|setup|summary|nvme|predicted)|error|slide_train:"
T=$BUILD/tests
ST=$BUILD/examples/llama/slide_train
run sliding_gpu 90 "$T/llama_cuda/llama_cuda_gpu_tests" "[sliding_gpu]"
run adam_gpu 90 "$T/optim/cuda/optim_gpu_tests" "[gpuadam]"
run cpu_adam 60 "$BUILD/bench/optim/cpu_adam_bench" --params=268435456 --threads=all --bf16=on \
  --grad=bf16 --master=fp32,split --reps=3
mkdir -p /tmp/po-nvme
common=(--model llama3-8b --seq 2048 --batch 1 --lr 1e-5 --clip 0 --gpu-memory-budget 24GiB
        --json "$LOG/slide.jsonl")
run nvme_dry_run 60 "$ST" "${common[@]}" --microbatches 8 --dry-run --backend cuda \
  --nvme-dir /tmp/po-nvme --nvme-fraction 0.25
run sliding_m8 150 "$ST" "${common[@]}" --microbatches 8 --steps 6
run sliding_m16 150 "$ST" "${common[@]}" --microbatches 16 --steps 4
