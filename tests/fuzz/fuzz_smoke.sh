#!/usr/bin/env bash
# The fuzz targets' short run for CI (ctest fuzz_smoke, from a gcc build): builds tests/fuzz with
# clang in a build of its own and runs each target for PO_FUZZ_SECONDS (default 15) seconds.
# Exits 77 (ctest: skipped) with the reason where no clang++ can link -fsanitize=fuzzer.
# usage: fuzz_smoke.sh <source dir> <build dir>
set -euo pipefail
source_dir=$1
build_dir=$2
clangxx=$(command -v clang++-14 || command -v clang++ || true)
clang=$(command -v clang-14 || command -v clang || true)
if [[ -z $clangxx || -z $clang ]]; then
  echo "fuzz_smoke: skipped: no clang++-14 or clang++ on PATH (the fuzz targets need libFuzzer)"
  exit 77
fi
mkdir -p "$build_dir"
probe=$build_dir/probe.cc
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe"
if ! "$clangxx" -fsanitize=fuzzer "$probe" -o "$build_dir/probe" 2>"$build_dir/probe.log"; then
  echo "fuzz_smoke: skipped: $clangxx cannot link -fsanitize=fuzzer (no libclang_rt.fuzzer;" \
       "Debian: libclang-rt-14-dev):"
  cat "$build_dir/probe.log"
  exit 77
fi
# Only what the targets link: no CUDA, MPI or test suites.
CC=$clang CXX=$clangxx cmake -S "$source_dir" -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPO_FUZZ=ON -DPO_BUILD_TESTS=OFF -DPO_WITH_CUDA=OFF \
  -DPO_WITH_MPI=OFF -DPO_FUZZ_SECONDS="${PO_FUZZ_SECONDS:-15}" >"$build_dir/configure.log" ||
  { cat "$build_dir/configure.log"; exit 1; }
cmake --build "$build_dir" --target po_fuzz_targets -j "${PO_FUZZ_JOBS:-2}"
ctest --test-dir "$build_dir" -L fuzz --output-on-failure
