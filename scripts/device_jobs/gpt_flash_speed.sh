#!/usr/bin/env bash
# binaries: gpt_kernels_gpu_tests gpt_cuda_gpu_tests gpt_cuda_train_gpu_tests llama_cuda_gpu_tests pipeline_bench gpt_cuda_perf_bench gpt_kernels_bench
# seconds: 420
# Issue 16, "at least PyTorch's speed", after the CUDA GPT's attention moved onto the shared
# flash kernel (examples/common/cuda/flash_attention.h):
#  1. the GPT GPU suites against the CPU reference (kernels incl. "[attention]", layer, lean,
#     pipeline, "GPU training steps track the CPU reference trainer") and the flash kernel's
#     own "[flash]" cases (moved out of examples/llama, still run from llama_cuda_gpu_tests);
#  2. one layer's F / B and its attention / LayerNorm pieces at h = 4096 and 8192
#     (bench/cuda/gpt_cuda_perf_bench, behind docs/benchmarks.md's one-layer table, where the
#     cuBLAS attention took F 0.47 / B 0.86 ms at h = 4096), and the attention alone at
#     NH = 64, hs = 128 (bench/cuda/gpt_kernels_bench "[bench_attention]");
#  3. the side-by-side: pipeline_bench 1f1b (no offload), 4 stages on the GPU, 16 layers
#     (v = 4 x 1 layer), seq 2048, m = 16 at h = 4096 and 8192, and scripts/torch_peer.py's same
#     16 layers without offload. The bar: ours <= PyTorch's step at both widths (the issue
#     measured 1.323 vs 1.183 s and 4.618 vs 4.431 s before).
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export TESTS_OUT="$LOG/tests.txt"; : >"$TESTS_OUT"
export NCCL_NVLS_ENABLE=0
t 60 "$BUILD/tests/gpt_cuda/gpt_kernels_gpu_tests"
t 90 "$BUILD/tests/gpt_cuda/gpt_cuda_gpu_tests"
t 60 "$BUILD/tests/gpt_cuda_train/gpt_cuda_train_gpu_tests" --durations yes
t 40 "$BUILD/tests/llama_cuda/llama_cuda_gpu_tests" "[flash]"
export TESTS_GREP="\[perf\]|bench"
t 40 "$BUILD/bench/cuda/gpt_cuda_perf_bench" "Layer stack chunk times" -s
grep -hE "^\[perf\]" "$LOG/part.txt" | head -10
t 40 "$BUILD/bench/cuda/gpt_cuda_perf_bench" "Where a layer's non-GEMM time goes" -s
grep -hE "^\[perf\]|attention|LayerNorm" "$LOG/part.txt" | head -20
t 30 "$BUILD/bench/cuda/gpt_kernels_bench" "[bench_attention]" -s
grep -hE "^bench" "$LOG/part.txt" | head -4
rm -f "$LOG/part.txt"

source scripts/find_cublas.sh
po_find_cublas "$BUILD/bench/cuda/pipeline_bench"
export JOB_DEADLINE_S=330
export RUN_GREP="mean step|step time|1f1b|\| none|error|FAILED"
for h in 4096 8192; do
  run "ours_h$h" 90 "$BUILD/bench/cuda/pipeline_bench" --model=gpt --hidden="$h" --seq=2048 \
    --stages=4 --microbatches=16 --family=group-interleaved --chunks=4 --layers-per-chunk=1 \
    --policies=1f1b --warmup=1 --steps=3 --out="$LOG/side_by_side.md" \
    --json="$LOG/ours.jsonl"
done
run "torch_peer" 150 python3 scripts/torch_peer.py --configs=4096:16,8192:16 --seq=2048 \
  --microbatches=16 --modes=none --warmup=1 --steps=3 --md="$LOG/side_by_side.md" \
  --json="$LOG/peer.jsonl"
echo "--- side by side ($LOG/side_by_side.md)"
cat "$LOG/side_by_side.md" 2>/dev/null | head -40
