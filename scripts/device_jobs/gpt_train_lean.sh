#!/usr/bin/env bash
# binaries: gpt_cuda_gpu_tests gpt_cuda_train_gpu_tests gpt_train
# seconds: 100
# gpt_train --saved lean: the full GPT with lean layers (pipeline tests incl. lean po-f +
# split backward == lean 1F1B bitwise), the trainer tests after GptCudaStageOptions, and
# h = 4096 po-f runs full vs lean (step time, stash peaks).
set -uo pipefail
timeout 40 "$BUILD/tests/gpt_cuda/gpt_cuda_gpu_tests" "[gpt_cuda_pipeline]" 2>&1 | tail -8
timeout 30 "$BUILD/tests/gpt_cuda_train/gpt_cuda_train_gpu_tests" 2>&1 | tail -4
big="--backend cuda --transport local --stages 4 --chunks 1 --embd 4096 --layers 4 --seq 2048"
big="$big --batch 1 --microbatches 8 --steps 3 --lr 0.0003 --watchdog 60 --schedule po-f"
for saved in full lean; do
  echo "== --saved $saved"
  timeout 25 "$BUILD/examples/gpt/gpt_train" $big --saved $saved 2>&1 | \
    grep -E "^plan|stage [0-9]: stash|stash peaks|mean step|checksum|rror" | cut -c1-260
done
