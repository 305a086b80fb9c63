#!/usr/bin/env bash
# Configures and builds pipeoffload into build/ (or $PO_BUILD_DIR). Extra arguments go to CMake.
# CUDA parts build when nvcc is found; PO_WITH_CUDA=OFF in the environment turns them off.
# PO_BUILD_TARGETS="a b" builds only those targets (and what they need).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${PO_BUILD_DIR:-$root/build}
cuda_flag=()
if [[ -n "${PO_WITH_CUDA:-}" ]]; then cuda_flag=(-DPO_WITH_CUDA="$PO_WITH_CUDA"); fi
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${PO_BUILD_TYPE:-RelWithDebInfo} \
  -DPO_WERROR=ON "${cuda_flag[@]}" "$@"
targets=()
for target in ${PO_BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build_dir" -j "${PO_JOBS:-$(nproc)}" "${targets[@]}"
