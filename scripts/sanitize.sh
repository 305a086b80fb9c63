#!/usr/bin/env bash
# The sanitizer pass (issue 17): builds the chosen CPU test suites with sanitizers and runs them
# under ctest, every report fatal.
#
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   scripts/sanitize.sh tsan   ThreadSanitizer over the threaded parts (build-tsan/)
#
# scripts/test.sh (the README's test command, which CI runs) runs both after the normal tests
# unless PO_SANITIZE_IN_TESTS=0. Environment:
#   PO_SANITIZE_BUILD_DIR   the build folder (default build-asan / build-tsan under the root)
#   PO_SANITIZE_SUITES      the ctest names (= test binaries) to build and run instead of the
#                           default set below, space-separated
#   PO_JOBS, PO_TEST_JOBS   build and ctest parallelism (default nproc, 2)
# Sanitizer builds are CPU only (PO_WITH_CUDA=OFF): device code is compute-sanitizer's, on the
# GPU machine (scripts/device_jobs/compute_sanitizer.sh). docs/hardening.md says what each set
# covers, what it costs and what it found.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-}

# The suites of each pass (ctest names; each is a Catch2 binary of the same name). Left out of
# the ASan set: the Python suites (an uninstrumented interpreter cannot load an ASan library
# without LD_PRELOAD), package_consumer (it installs the libraries and builds uninstrumented
# consumers against them), fuzz_smoke (tests/fuzz has its own clang ASan build), the MPI suites
# (this build turns MPI off: they need mpirun and Open MPI's own allocations), the CLI scripts
# (po_schedule_cli, po_schedule_hostile: the compiler's code runs in schedule_tests), and the
# GPT and Llama trainer suites (gpt_*_tests, llama_*_tests, slide_train_tests: not measured
# under ASan yet; docs/hardening.md has the timings of the set below).
asan_suites="base_tests schedule_tests backend_tests memory_tests runtime_tests transport_tests
  optim_tests optim_offload_tests slide_nvme_tests slide_tests c_api c_api_stage"
# What runs threads: the CPU backend's copy engines, the local transport and rank groups, the
# executor and the way in (stages as threads), the optimizer's worker pool and offload engine,
# the sliding engine's update worker and NVMe threads, the compiler's ParallelFor (base_tests;
# runtime_tests compiles offload plans, so the planner's threads run there too).
tsan_suites="base_tests backend_tests memory_tests runtime_tests transport_tests optim_tests
  optim_offload_tests slide_nvme_tests slide_tests"

case "$kind" in
  asan)
    sanitize=address,undefined
    suites=${PO_SANITIZE_SUITES:-$asan_suites}
    # halt_on_error: the first report fails the test. detect_stack_use_after_return finds
    # pointers to a returned frame (callbacks that outlive their caller's locals).
    asan=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1
    export ASAN_OPTIONS=$asan:check_initialization_order=1:strict_init_order=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    ;;
  tsan)
    sanitize=thread
    suites=${PO_SANITIZE_SUITES:-$tsan_suites}
    tsan=suppressions=$root/tests/sanitizers/tsan.supp:print_suppressions=0
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:$tsan
    ;;
  *)
    echo "usage: $0 asan|tsan" >&2
    exit 2
    ;;
esac

build_dir=${PO_SANITIZE_BUILD_DIR:-$root/build-$kind}
echo "sanitize $kind: -fsanitize=$sanitize in $build_dir"
start=$SECONDS
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPO_WERROR=ON \
  -DPO_WITH_CUDA=OFF -DPO_WITH_MPI=OFF -DPO_SANITIZE=$sanitize >/dev/null
# Each suite's binary has its name, except the C ABI's (tests/c_api: c_api runs c_api_test).
targets=()
for suite in $suites; do
  case "$suite" in
    c_api | c_api_stage) targets+=("${suite}_test") ;;
    *) targets+=("$suite") ;;
  esac
done
cmake --build "$build_dir" -j "${PO_JOBS:-$(nproc)}" --target "${targets[@]}"
built=$SECONDS
regex="^($(echo $suites | tr ' ' '|'))\$"
echo "sanitize $kind: running" $suites
for var in ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS; do
  [[ -n "${!var:-}" ]] && echo "  $var=${!var}"
done
status=0
ctest --test-dir "$build_dir" --output-on-failure -j "${PO_TEST_JOBS:-2}" -R "$regex" || status=$?
echo "sanitize $kind: build $((built - start)) s, tests $((SECONDS - built)) s, exit $status"
exit $status
