#!/usr/bin/env bash
# binaries: slide_train
# seconds: 480
# Issue 13's NVMe tier for activation checkpoints (--nvme-checkpoints): Llama-3-8B in 24 GiB
# at 8 x 2048 with every checkpoint, then half of them (the lowest layers), on the local drive
# and m, v on the host (--nvme-fraction 0), beside the same run with every checkpoint pinned
# (the step lines show the drive bytes; setup shows the pinned bytes saved); then the 18.3B
# shape of slide_largest_nvme.sh as dry runs, m, v of 60% of the layers on the drive, with and
# without its checkpoints there: the host bytes of each plan. JSON in slide.jsonl.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-420}
export RUN_GREP="^(model|placement|ring|device|host|setup|step|summary|nvme|predicted)|error|slide_train:"
ST=$BUILD/examples/llama/slide_train
df -h /tmp | tee "$LOG/df.txt"
free -g | tee -a "$LOG/df.txt"
common=(--model llama3-8b --seq 2048 --batch 1 --microbatches 8 --steps 3 --lr 1e-5 --clip 0
        --gpu-memory-budget 24GiB --json "$LOG/slide.jsonl")
mkdir -p /tmp/po-nvme
run ckpt_host 120 "$ST" "${common[@]}"
run ckpt_nvme_all 150 "$ST" "${common[@]}" --nvme-dir /tmp/po-nvme --nvme-fraction 0 \
  --nvme-checkpoints 1.0
run ckpt_nvme_half 150 "$ST" "${common[@]}" --nvme-dir /tmp/po-nvme --nvme-fraction 0 \
  --nvme-checkpoints 0.5
cp scripts/device_jobs/llama18b_config.json "$LOG/config.json"  # the 18.3B shape (InternLM2-20B widths)
big=(--config "$LOG/config.json" --seq 2048 --batch 1 --microbatches 8 --clip 0
     --gpu-memory-budget 130GiB --nvme-dir /tmp/po-nvme --nvme-fraction 0.6 --dry-run)
run llama18b_dry_state 40 "$ST" "${big[@]}"
run llama18b_dry_ckpt 40 "$ST" "${big[@]}" --nvme-checkpoints 1.0
rm -rf /tmp/po-nvme
