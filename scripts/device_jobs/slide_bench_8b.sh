#!/usr/bin/env bash
# binaries: slide_train
# seconds: 560
# Issue 13's benchmark: Llama-3-8B shape (random init), seq 2048, sliding in a 24 GiB budget
# against the all-on-GPU run of the same binary and the ZeRO-Offload-style timing, at 8 x 2048
# tokens per step and a larger batch where the CPU update can hide. One JSON line per run in
# slide.jsonl; the 8 x 2048 sliding run's trace in trace_m8.json.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-500}
export RUN_GREP="^(model|plan|ring|placement|device|host|setup|step|summary)|error|slide_train:"
ST=$BUILD/examples/llama/slide_train
{ nproc; free -g; df -h /tmp .; nvidia-smi --query-gpu=name,memory.total --format=csv; } > "$LOG/machine.txt" 2>&1
common=(--model llama3-8b --seq 2048 --batch 1 --clip 0 --json "$LOG/slide.jsonl")
run sliding_m8 170 "$ST" "${common[@]}" --microbatches 8 --steps 6 --gpu-memory-budget 24GiB \
  --trace "$LOG/trace_m8.json"
run resident_m8 150 "$ST" "${common[@]}" --microbatches 8 --steps 5 --resident all
run zero_offload_m8 150 "$ST" "${common[@]}" --microbatches 8 --steps 3 --gpu-memory-budget 24GiB \
  --update-timing after-backward
run sliding_m24 200 "$ST" "${common[@]}" --microbatches 24 --steps 4 --gpu-memory-budget 24GiB
clipped=(--model llama3-8b --seq 2048 --batch 1 --clip 1.0 --json "$LOG/slide.jsonl")
run sliding_m8_clip 170 "$ST" "${clipped[@]}" --microbatches 8 --steps 5 --gpu-memory-budget 24GiB
