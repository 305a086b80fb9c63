#!/usr/bin/env bash
# binaries: slide_train
# seconds: 570
# Issue 13's benchmark as planned by default (sliding head, embedding + layers 0-1 resident,
# 4 slots, 3 landing buffers): 8 x 2048 in 24 GiB with a trace, the PyTorch peer (item c),
# clipping, the NVMe tier (m, v of a quarter of the sliding layers) and the largest model run
# here (Qwen3-14B with the whole GPU). JSON in slide.jsonl and torch.jsonl.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-500}
export RUN_GREP="^(placement|ring|device|host|setup|step|summary|nvme)|error|slide_train:|torch_llama_peer|\\|"
ST=$BUILD/examples/llama/slide_train
common=(--seq 2048 --batch 1 --lr 1e-5 --json "$LOG/slide.jsonl")
run sliding_m8 150 "$ST" --model llama3-8b "${common[@]}" --clip 0 --gpu-memory-budget 24GiB \
  --microbatches 8 --steps 6 --trace "$LOG/trace_m8.json"
export PYTHONUNBUFFERED=1
run torch_peer 200 python3 scripts/torch_llama_peer.py --configs=8:2048,16:2048 --steps=4 \
  --warmup=2 --json="$LOG/torch.jsonl"
run sliding_m8_clip 130 "$ST" --model llama3-8b "${common[@]}" --clip 1.0 \
  --gpu-memory-budget 24GiB --microbatches 8 --steps 5
mkdir -p /tmp/po-nvme
run nvme_m8 130 "$ST" --model llama3-8b "${common[@]}" --clip 0 --gpu-memory-budget 24GiB \
  --microbatches 8 --steps 4 --nvme-dir /tmp/po-nvme --nvme-fraction 0.25
run qwen3_14b_m8 150 "$ST" --model qwen3-14b "${common[@]}" --clip 0 \
  --gpu-memory-budget 130GiB --microbatches 8 --steps 3
