#!/usr/bin/env bash
# binaries: nccl_gpu_tests gpt_train
# seconds: 560
# Two H200s (device kind nvidia-h200-x2): the NCCL suite with its "[multi]" cases, then issue 7's
# command lines at P = 2 (scripts/device_multi_gpu.sh): all six schedules at h = 4096, 1f1b and
# po-f at h = 8192, with traces at h = 4096; one po-f run with the worst-case P2P reserve to set
# the planned arenas (P2PGuarantee::kMessageConsumed over NCCL) against it.
set -uo pipefail
echo "== nccl_gpu_tests"
timeout 90 "$BUILD/tests/gpu/nccl_gpu_tests" >"$LOG/nccl_gpu_tests.txt" 2>&1
echo "rc=$?"; tail -5 "$LOG/nccl_gpu_tests.txt"
export GPT_TRAIN="$BUILD/examples/gpt/gpt_train" GPUS=2 STEPS=4
OUT="$LOG/multi" HIDDEN=4096 bash scripts/device_multi_gpu.sh 2>&1 | tail -40
OUT="$LOG/multi8192" HIDDEN=8192 SCHEDULES="1f1b po-f" bash scripts/device_multi_gpu.sh 2>&1 | tail -20
echo "== po-f h=4096 --p2p-reserve worst"
timeout 120 mpirun -np 2 --bind-to none -x NCCL_NVLS_ENABLE "$GPT_TRAIN" --transport mpi --backend cuda \
  --embd 4096 --layers 32 --seq 2048 --batch 1 --microbatches 8 --lr 0.0003 --schedule po-f \
  --steps 4 --watchdog 300 --p2p-reserve worst >"$LOG/pof_worst.log" 2>&1
echo "rc=$?"; grep -E "^stage|^mean step|checksum|arena|error" "$LOG/pof_worst.log" | head -20
