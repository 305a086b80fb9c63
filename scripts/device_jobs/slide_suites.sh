#!/usr/bin/env bash
# binaries: llama_cuda_gpu_tests optim_gpu_tests slide_tests slide_nvme_tests cpu_adam_bench
# seconds: 420
# Issue 13 on the GPU: flash attention, the Llama kernels / units / model against the CPU
# reference, the sliding engine with the CUDA model ([sliding_gpu]), the bf16-gradient Adam
# kernels; the hidden timings of flash attention and the fused cross-entropy; the CPU suites of
# the engine and the NVMe store on the GPU machine's own CPU and disk; CPU Adam fp32 vs bf16
# gradients on its host.
set -u
source scripts/device_jobs/job_lib.sh
export JOB_DEADLINE_S=400
export RUN_GREP="FAILED|passed|failed|test cases|TFLOP|ms|GB/s|G params|rel|loss|budget|real text"
T=$BUILD/tests
run flash_and_kernels 150 "$T/llama_cuda/llama_cuda_gpu_tests" "[flash],[llama_cuda]"
run sliding_gpu 200 "$T/llama_cuda/llama_cuda_gpu_tests" "[sliding_gpu]" -s
run adam_bf16 60 "$T/optim/cuda/optim_gpu_tests" "[gpuadam]"
run flash_bench 60 "$T/llama_cuda/llama_cuda_gpu_tests" "[.flash_bench]" -s
run ce_bench 90 "$T/llama_cuda/llama_cuda_gpu_tests" "[.llama_cuda_bench]" -s
mkdir -p /tmp/po-nvme && PO_NVME_TEST_DIR=/tmp/po-nvme run nvme_store 60 "$T/slide/slide_nvme_tests"
run slide_cpu 60 "$T/slide/slide_tests"
run cpu_adam 90 "$BUILD/bench/optim/cpu_adam_bench" --params=268435456 --threads=all --bf16=on --grad=fp32,bf16 --reps=3
