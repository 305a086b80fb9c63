#!/usr/bin/env bash
# Runs on the GPU machine: pipeline_bench --model=gemm --policies=1f1b,po-h,po-f (the GEMM
# stand-in layers; p = 4 stages on one GPU, 1F1B) at h = 4096 and 8192, then 2048 when
# --with-2048 is given, appending each markdown table to $OUT/pipeline_bench.md (the device
# tool's output folder; else ./device-logs) and each run's stderr to $OUT/pipeline_bench.log.
# Built on the build machine (pipeline_bench is in bench/cuda of a -DPO_WITH_CUDA=ON build;
# `scripts/device_build_check.sh --pack` copies it). The whole issue-5 benchmark (the GPT layer
# stack, every policy, the PyTorch peer, the checklist) is scripts/device_gpt_bench.sh.
#
#   scripts/device_pipeline_bench.sh [BUILD_DIR] [--with-2048] [-- EXTRA pipeline_bench FLAGS]
#       BUILD_DIR: $PO_BUILD_DIR, else build-cuda
#
# pipeline_bench links cuBLAS dynamically: when the loader cannot find libcublas here, the
# script looks for it under /usr/local/cuda*/lib64 and in the python3's nvidia-cublas package.
# Exit status: 0 when every run passed (77 from pipeline_bench, "no GPU", counts as a failure).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

build=""
hiddens=(4096 8192)
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --with-2048) hiddens+=(2048) ;;
    --) shift; extra=("$@"); break ;;
    *) build=$1 ;;
  esac
  shift
done
build=${build:-${PO_BUILD_DIR:-$root/build-cuda}}
bench=$(find "$build" -name pipeline_bench -type f -perm -u+x 2>/dev/null | head -1)
if [[ -z "$bench" ]]; then
  echo "device_pipeline_bench: no pipeline_bench under $build (build with -DPO_WITH_CUDA=ON)" >&2
  exit 2
fi
out=${OUT:-$PWD/device-logs}
mkdir -p "$out"
md="$out/pipeline_bench.md"
log="$out/pipeline_bench.log"
export NCCL_NVLS_ENABLE=0

source "$root/scripts/find_cublas.sh"
po_find_cublas "$bench"

{
  echo "## pipeline_bench, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/GPU: /'
  echo
} >>"$md"
ldd "$bench" >>"$log" 2>&1

status=0
for h in "${hiddens[@]}"; do
  echo "=== h=$h" | tee -a "$log"
  start=$(date +%s)
  "$bench" --model=gemm --hidden="$h" --seq=2048 --policies=1f1b,po-h,po-f --out="$md" \
    "${extra[@]}" 2>>"$log"
  rc=$?
  echo "h=$h: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$log"
  [[ $rc -eq 0 ]] || status=1
done
echo "device_pipeline_bench: $([[ $status -eq 0 ]] && echo PASSED || echo FAILED)" | tee -a "$log"
exit $status
