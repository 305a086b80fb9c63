#!/usr/bin/env bash
# binaries: gpt_train gpt_cuda_train_gpu_tests
# seconds: 540
# gpt_train --costs measured (the default with --backend cuda) on two H200s over NCCL (device
# kind nvidia-h200-x2): each order without offload next to po-f / po-h planned on the measured
# chunk times and host link, at h = 8192 (8 layers, v = 4: 1 layer per chunk) and h = 4096
# (32 layers, v = 4), m = 8; then the one-GPU local transport at h = 4096 (p = 4, 16 layers),
# po-f measured vs nominal. Traces of the h = 8192 pair (P2P time with and without offload).
# First the CUDA trainer's GPU tests (offload on/off bitwise, now with measuring at set-up).
# Runs that would start past 450 s are skipped, so the batch ends inside one device call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
train="$BUILD/examples/gpt/gpt_train"
JOB_DEADLINE_S=450
source scripts/device_jobs/job_lib.sh
echo "== gpt_cuda_train_gpu_tests"
timeout 90 "$BUILD/tests/gpt_cuda_train/gpt_cuda_train_gpu_tests" >"$LOG/gpt_cuda_train_gpu_tests.txt" 2>&1
echo "rc=$?"; tail -3 "$LOG/gpt_cuda_train_gpu_tests.txt"
mpi=(mpirun -np 2 --bind-to none -x NCCL_NVLS_ENABLE "$train" --transport mpi --backend cuda
     --seq 2048 --batch 1 --microbatches 8 --lr 0.0003 --steps 4 --watchdog 300)
h8=(--embd 8192 --layers 8 --chunks 4)
h4=(--embd 4096 --layers 32 --chunks 4)
run 2gpu_h8192_gi 150 "${mpi[@]}" "${h8[@]}" --schedule group-interleaved --trace "$LOG/2gpu_h8192_gi_trace.json"
run 2gpu_h8192_pof 150 "${mpi[@]}" "${h8[@]}" --schedule po-f --trace "$LOG/2gpu_h8192_pof_trace.json"
run 2gpu_h4096_gi 100 "${mpi[@]}" "${h4[@]}" --schedule group-interleaved
run 2gpu_h4096_pof 100 "${mpi[@]}" "${h4[@]}" --schedule po-f
run 2gpu_h4096_poh 100 "${mpi[@]}" "${h4[@]}" --schedule po-h
one=("$train" --transport local --backend cuda --stages 4 --embd 4096 --layers 16 --chunks 4
     --seq 2048 --batch 1 --microbatches 16 --lr 0.0003 --steps 4 --watchdog 300)
run 1gpu_h4096_gi 60 "${one[@]}" --schedule group-interleaved
run 1gpu_h4096_pof 60 "${one[@]}" --schedule po-f
run 1gpu_h4096_pof_nominal 60 "${one[@]}" --schedule po-f --costs nominal
