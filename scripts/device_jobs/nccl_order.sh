#!/usr/bin/env bash
# binaries: nccl_gpu_tests
# seconds: 60
# Issue 16, "no host waits on the P2P path": the NCCL transport's OrderAfter on one GPU with a
# one-rank communicator (nccl_gpu_tests "[order]": a send reads what a spinning compute stream
# wrote last, a receive overwrites a block only after compute read it, the host does not wait).
set -uo pipefail
source scripts/device_jobs/job_lib.sh
export TESTS_OUT="$LOG/tests.txt"; : >"$TESTS_OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t 50 mpiexec -n 1 "$BUILD/tests/gpu/nccl_gpu_tests" "[order]"
rm -f "$LOG/part.txt"
