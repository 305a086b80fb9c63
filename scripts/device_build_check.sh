#!/usr/bin/env bash
# Runs on the GPU machine, against a build made on the build machine (that machine has no GPU;
# this one has no Abseil, so nothing is compiled here): the gpu-labelled CTest suites, the
# multi-rank NCCL cases when there are two or more GPUs, then copy_bench. Logs go to $OUT
# (the device tool's output folder), else to ./device-logs.
#
#   scripts/device_build_check.sh [BUILD_DIR]    BUILD_DIR: $PO_BUILD_DIR, else build-cuda
#   scripts/device_build_check.sh --pack BUILD_DIR DEST
#       (on the build machine) copies what the run needs into DEST, binaries stripped of debug
#       info: CMakeCache.txt, every CTestTestfile.cmake, gpu_tests, nccl_gpu_tests, copy_bench
#       and pipeline_bench (about 10 MB instead of the whole build; pipeline_bench loads the
#       device machine's libcublas). Carry DEST and run this script, or
#       scripts/device_pipeline_bench.sh DEST, on it.
#
# Files written (at most 8, as the device tool returns): machine.txt, ctest_gpu.log,
# ctest_gpu.xml (JUnit), nccl_multi.log, copy_bench.md, copy_bench.csv, summary.txt.
# Exit status: 0 when every step passed (a suite skipped for want of a GPU counts as a failure
# here, since this script exists to run them on one).
set -uo pipefail
# shellcheck disable=SC2317  # the functions below run through step()
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ "${1:-}" == "--pack" ]]; then
  if [[ $# -ne 3 || ! -f "$2/CMakeCache.txt" ]]; then
    echo "usage: $0 --pack BUILD_DIR DEST (BUILD_DIR must hold a CMake build)" >&2
    exit 2
  fi
  src=$(cd "$2" && pwd)
  mkdir -p "$3"
  dest=$(cd "$3" && pwd)
  cp "$src/CMakeCache.txt" "$dest/"
  while IFS= read -r file; do
    mkdir -p "$dest/$(dirname "$file")"
    cp "$src/$file" "$dest/$file"
  done < <(cd "$src" && find . -name CTestTestfile.cmake)
  for name in gpu_tests nccl_gpu_tests copy_bench pipeline_bench; do
    while IFS= read -r file; do
      mkdir -p "$dest/$(dirname "$file")"
      strip --strip-debug -o "$dest/$file" "$src/$file"
    done < <(cd "$src" && find . -name "$name" -type f -perm -u+x)
  done
  du -sh "$dest"
  exit 0
fi

build=${1:-${PO_BUILD_DIR:-$root/build-cuda}}
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  echo "device_build_check: no CMake build at $build (build with -DPO_WITH_CUDA=ON first)" >&2
  exit 2
fi
build=$(cd "$build" && pwd)
out=${OUT:-$PWD/device-logs}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# Multicast stays off on shared multi-GPU hosts; mpirun runs as root in these containers.
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

{
  date -u
  uname -a
  nvidia-smi || echo "nvidia-smi failed"
  command -v ctest && ctest --version | head -1
  command -v mpiexec && mpiexec --version | head -1
} >"$out/machine.txt" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
note "device_build_check: $gpus GPU(s), build $build, commit $commit"

# CTest files hold the build machine's absolute paths (binaries, sources as working
# directory). When this copy of the tree lives elsewhere, make those paths lead here.
recorded_build=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$build/CMakeCache.txt")
recorded_source=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
link_path() {  # link_path RECORDED ACTUAL
  if [[ -n "$1" && "$1" != "$2" && ! -e "$1" ]]; then
    mkdir -p "$(dirname "$1")" && ln -s "$2" "$1" && note "linked $1 -> $2"
  fi
}
link_path "$recorded_source" "$root"
link_path "$recorded_build" "$build"
ctest_dir=$recorded_build
[[ -d "$ctest_dir" ]] || ctest_dir=$build

status=0
step() {  # step NAME COMMAND...: runs, records pass / FAIL in the summary
  local name=$1
  shift
  if "$@"; then note "PASS $name"; else note "FAIL $name"; status=1; fi
}

run_ctest() {
  (cd "$ctest_dir" && ctest -L gpu --output-on-failure --no-tests=error \
     --output-junit "$out/ctest_gpu.xml") 2>&1 | tee "$out/ctest_gpu.log"
  local rc=${PIPESTATUS[0]}
  if grep -q "Skipped" "$out/ctest_gpu.log"; then
    note "gpu suites were SKIPPED (no usable GPU?); see ctest_gpu.log"
    return 1
  fi
  return "$rc"
}
step "ctest -L gpu" run_ctest

nccl_tests=$(find "$build" -name nccl_gpu_tests -type f -perm -u+x | head -1)
if [[ "$gpus" -ge 2 && -n "$nccl_tests" ]]; then
  step "nccl multi-rank ($gpus ranks)" bash -c "mpiexec -n $gpus '$nccl_tests' '[multi]' 2>&1 |
    tee '$out/nccl_multi.log'; exit \${PIPESTATUS[0]}"
else
  echo "skipped: needs 2+ GPUs (have $gpus) and nccl_gpu_tests (${nccl_tests:-not built})" \
    >"$out/nccl_multi.log"
  note "nccl multi-rank: not run (${gpus} GPU(s))"
fi

bench=$(find "$build" -name copy_bench -type f -perm -u+x | head -1)
if [[ -n "$bench" ]]; then
  step "copy_bench" bash -c "'$bench' --csv='$out/copy_bench.csv' --commit='$commit' 2>&1 |
    tee '$out/copy_bench.md'; exit \${PIPESTATUS[0]}"
else
  note "FAIL copy_bench: not built (wire bench/cuda/CMakeLists.txt into the build)"
  status=1
fi

note "device_build_check: $([[ $status -eq 0 ]] && echo PASSED || echo FAILED)"
exit $status
