#!/usr/bin/env bash
# binaries: gpt_train nccl_gpu_tests
# seconds: 220
# After the NCCL transport's headers moved to SM copies (lib/backend/cuda/sm_copy_kernel.h): the
# NCCL suite on two GPUs, then measured_costs_2gpu.sh's h = 8192 pair (group-interleaved v = 4
# without offload, po-f, traces) and its h = 4096 po-f, to set against that job's numbers.
# Two H200s (nvidia-h200-x2). Runs that would start past 170 s are skipped.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
train="$BUILD/examples/gpt/gpt_train"
echo "== nccl_gpu_tests"
timeout 60 "$BUILD/tests/gpu/nccl_gpu_tests" >"$LOG/nccl_gpu_tests.txt" 2>&1
echo "rc=$?"; tail -2 "$LOG/nccl_gpu_tests.txt"
JOB_DEADLINE_S=170
source scripts/device_jobs/job_lib.sh
mpi=(mpirun -np 2 --bind-to none -x NCCL_NVLS_ENABLE "$train" --transport mpi --backend cuda
     --seq 2048 --batch 1 --microbatches 8 --lr 0.0003 --steps 4 --watchdog 300)
h8=(--embd 8192 --layers 8 --chunks 4)
run 2gpu_h8192_gi 75 "${mpi[@]}" "${h8[@]}" --schedule group-interleaved --trace "$LOG/2gpu_h8192_gi_trace.json"
run 2gpu_h8192_pof 75 "${mpi[@]}" "${h8[@]}" --schedule po-f --trace "$LOG/2gpu_h8192_pof_trace.json"
run 2gpu_h4096_pof 75 "${mpi[@]}" --embd 4096 --layers 32 --chunks 4 --schedule po-f
