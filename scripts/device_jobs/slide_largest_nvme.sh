#!/usr/bin/env bash
# binaries: slide_train
# seconds: 330
# Issue 13's largest model with the NVMe tier: an 18.3B Llama shape (InternLM2-20B's widths,
# 44 layers: hidden 6144, ffn 16384, 48/8 heads, vocab 92544) with the whole GPU (130 GiB) and
# m, v of 60% of the sliding layers on the local drive. Without NVMe it needs 153 GB of host
# memory (the machine has 125 GiB); with it, 109 GB of host and 50 GB of disk (dry run).
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-300}
export RUN_GREP="^(model|placement|ring|device|host|setup|step|summary|nvme)|error|slide_train:"
ST=$BUILD/examples/llama/slide_train
cp scripts/device_jobs/llama18b_config.json "$LOG/config.json"  # the 18.3B shape (InternLM2-20B widths)
df -h /tmp | tee "$LOG/df.txt"
free -g | tee -a "$LOG/df.txt"
mkdir -p /tmp/po-nvme-18b
run llama18b_nvme 300 "$ST" --config "$LOG/config.json" --seq 2048 --batch 1 --microbatches 8 \
  --steps 3 --lr 1e-5 --clip 0 --gpu-memory-budget 130GiB --nvme-dir /tmp/po-nvme-18b \
  --nvme-fraction 0.6 --json "$LOG/slide.jsonl"
rm -rf /tmp/po-nvme-18b
