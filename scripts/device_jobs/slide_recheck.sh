#!/usr/bin/env bash
# binaries: llama_cuda_gpu_tests slide_train
# seconds: 560
# Issue 13 after the split master, the NVMe low halves and the head-last order: the sliding
# engine's GPU suite (the fixed real-text test among it), the fused loss with its per-phase
# times beside PyTorch's materialised loss and Liger's fused one, Llama-3-8B in 24 GiB at 8 x 2048
# over 10 steps (the headline, untraced), the NVMe tier at a quarter of the sliding layers, and
# Qwen3-14B with the whole GPU (host bytes per parameter without NVMe). JSON in slide.jsonl.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=${JOB_DEADLINE_S:-500}
export RUN_GREP="FAILED|passed|failed|test cases|^real text|^budget|fused|phases|^\\||^(placement|ring|device|host|setup|summary|nvme)|^step +[0-9]+:|error|slide_train:|torch_ce_peer"
T=$BUILD/tests
ST=$BUILD/examples/llama/slide_train
run sliding_gpu 90 "$T/llama_cuda/llama_cuda_gpu_tests" "[sliding_gpu]"
run ce_bench 60 "$T/llama_cuda/llama_cuda_gpu_tests" "[.llama_cuda_bench]"
export PYTHONUNBUFFERED=1
run torch_ce 60 python3 scripts/torch_ce_peer.py --json "$LOG/torch_ce.jsonl"
common=(--seq 2048 --batch 1 --lr 1e-5 --clip 0 --json "$LOG/slide.jsonl")
run sliding_m8 150 "$ST" --model llama3-8b "${common[@]}" --gpu-memory-budget 24GiB \
  --microbatches 8 --steps 10
mkdir -p /tmp/po-nvme
run nvme_m8 120 "$ST" --model llama3-8b "${common[@]}" --gpu-memory-budget 24GiB \
  --microbatches 8 --steps 3 --nvme-dir /tmp/po-nvme --nvme-fraction 0.25
rm -rf /tmp/po-nvme
run qwen3_14b_m8 150 "$ST" --model qwen3-14b "${common[@]}" --gpu-memory-budget 130GiB \
  --microbatches 8 --steps 3
