#!/usr/bin/env bash
# Regenerates tests/golden/*.txt from the schedule builders, and the SVG picture
# tests/golden/1f1b_p2_m4_po-h.svg from the compiler, simulator and SVG writer; the only writer
# of those files. It builds schedule_tests and runs its "[golden]" cases with PO_UPDATE_GOLDEN=1,
# which write the files instead of diffing them, then shows what changed. Review that diff before
# committing: a changed golden file is a changed schedule (or, for the SVG, a changed picture:
# open it in a browser).
# Usage: scripts/update_golden.sh [build_dir]    (default: $PO_BUILD_DIR, else build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-${PO_BUILD_DIR:-$root/build}}
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPO_WERROR=ON
fi
cmake --build "$build_dir" --target schedule_tests -j "${PO_JOBS:-2}"
PO_UPDATE_GOLDEN=1 PO_GOLDEN_DIR="$root/tests/golden" \
  "$build_dir/tests/schedule_tests" "[golden]" --order lex
# Then diff them against the builders once more, the way CI will.
"$build_dir/tests/schedule_tests" "[golden]" --order lex
if command -v git >/dev/null 2>&1 && git -C "$root" rev-parse >/dev/null 2>&1; then
  git -C "$root" status --short -- tests/golden
  git -C "$root" --no-pager diff --stat -- tests/golden
fi
