#!/usr/bin/env bash
# binaries:
# seconds: 300
# Issue 13 item (c): Hugging Face LlamaForCausalLM at the Llama-3-8B shape, bf16 parameters and
# fused AdamW state, SDPA, gradient checkpointing, all on the H200 (scripts/torch_llama_peer.py):
# a 2-layer smoke run first, then 8 x 2048 and 16 x 2048 tokens per step.
set -u
export PYTHONUNBUFFERED=1
timeout 40 python3 scripts/torch_llama_peer.py --layers-override=2 --configs=2:512 --steps=2 \
  2>&1 | tee "$LOG/smoke.md" | tail -5
timeout 250 python3 scripts/torch_llama_peer.py --configs=8:2048,16:2048 --steps=4 --warmup=2 \
  --json="$LOG/torch.jsonl" 2>&1 | tee "$LOG/torch.md" | tail -15
