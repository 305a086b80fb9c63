#!/usr/bin/env bash
# The README's test command: set up, build, and run every test this machine can run.
# Without a GPU, tests labelled gpu are skipped (ctest prints the reason below); MPI tests run
# with --allow-run-as-root --oversubscribe so they pass as root on 2 cores. Then the sanitizer
# pass (below).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build_dir=${PO_BUILD_DIR:-$root/build}
label_args=()
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test: no GPU on this machine: skipping tests labelled 'gpu' (scripts/device_build_check.sh runs them on a GPU machine)"
  label_args=(-LE gpu)
fi
(cd "$build_dir" && ctest --output-on-failure -j "${PO_TEST_JOBS:-2}" "${label_args[@]}")
# The sanitizer pass (issue 17; scripts/sanitize.sh says what it runs, docs/hardening.md what it
# costs): ASan + UBSan over the CPU suites, TSan over the threaded ones, each in a build folder
# of its own. PO_SANITIZE_IN_TESTS=0 skips it.
if [[ "${PO_SANITIZE_IN_TESTS:-1}" != 0 ]]; then
  "$root/scripts/sanitize.sh" asan
  "$root/scripts/sanitize.sh" tsan
else
  echo "test: PO_SANITIZE_IN_TESTS=0: skipping the sanitizer pass (scripts/sanitize.sh)"
fi
