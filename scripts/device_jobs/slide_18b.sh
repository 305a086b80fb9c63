#!/usr/bin/env bash
# binaries: slide_train
# seconds: 330
# The largest model on this machine after the split master: the 18.3B Llama shape of
# slide_largest_nvme.sh (InternLM2-20B widths, 44 layers) with the whole GPU, first with every
# byte of state in host memory (the plan: 89.7 GB pageable + 28.9 GB pinned = 110.5 GiB of the
# host's 125 GiB), then with only the activation checkpoints on the drive (--nvme-checkpoints 1,
# m and v on the host): the step time and the host peak of each. JSON in slide.jsonl.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-170}
export RUN_GREP="^(model|placement|ring|device|host|setup|step|summary|nvme|predicted)|error|slide_train:|Killed"
ST=$BUILD/examples/llama/slide_train
free -g | tee "$LOG/free.txt"
cp scripts/device_jobs/llama18b_config.json "$LOG/config.json"  # the 18.3B shape (InternLM2-20B widths)
big=(--config "$LOG/config.json" --seq 2048 --batch 1 --microbatches 8 --clip 0 --lr 1e-5
     --gpu-memory-budget 130GiB --steps 4 --json "$LOG/slide.jsonl")
run llama18b_host 160 "$ST" "${big[@]}"
mkdir -p /tmp/po-nvme
run llama18b_ckpt_nvme 160 "$ST" "${big[@]}" --nvme-dir /tmp/po-nvme --nvme-fraction 0 \
  --nvme-checkpoints 1.0
rm -rf /tmp/po-nvme
