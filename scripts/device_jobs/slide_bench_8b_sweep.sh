#!/usr/bin/env bash
# binaries: slide_train
# seconds: 560
# Issue 13's benchmark, second part: where the 8 x 2048 sliding step loses against the
# all-on-GPU one (the head sliding so that its CPU update runs in the forward's idle CPU
# time, two more decoder layers resident instead; 16 CPU Adam threads), and the batch where
# the CPU update hides (M = 12, 16 sliding; M = 16, 24 all on the GPU). JSON in slide.jsonl.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-500}
export RUN_GREP="^(placement|ring|device|host|setup|summary)|error|slide_train:"
ST=$BUILD/examples/llama/slide_train
common=(--model llama3-8b --seq 2048 --batch 1 --clip 0 --lr 1e-5 --json "$LOG/slide.jsonl")
budget=(--gpu-memory-budget 24GiB)
run head_sliding_m8 150 "$ST" "${common[@]}" "${budget[@]}" --microbatches 8 --steps 6 \
  --resident 0,1,2 --slots 3 --landing-buffers 3 --trace "$LOG/trace_head_sliding_m8.json"
run head_sliding_4slots_m8 130 "$ST" "${common[@]}" "${budget[@]}" --microbatches 8 --steps 5 \
  --resident 0,1,2 --landing-buffers 3
run sliding_m8 130 "$ST" "${common[@]}" "${budget[@]}" --microbatches 8 --steps 5
run threads16_m8 130 "$ST" "${common[@]}" "${budget[@]}" --microbatches 8 --steps 5 --cpu-threads 16
run resident_m16 90 "$ST" "${common[@]}" --microbatches 16 --steps 4 --resident all
run resident_m24 90 "$ST" "${common[@]}" --microbatches 24 --steps 3 --resident all
run sliding_m16 130 "$ST" "${common[@]}" "${budget[@]}" --microbatches 16 --steps 4
run sliding_m12 130 "$ST" "${common[@]}" "${budget[@]}" --microbatches 12 --steps 4
