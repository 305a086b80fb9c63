#!/usr/bin/env bash
# The README's main job: set up, build, and train the example GPT as a 4-stage pipeline under
# MPI with full activation offload (po-f on group-interleaved, 2 chunks per stage) on its
# embedded corpus: about a minute on 2 cores. It prints the loss per step, each stage's measured
# stash peak next to the compiler's prediction, and the parameter checksum. Extra arguments go
# to gpt_train (try --help), e.g. scripts/run_main.sh --schedule 1f1b --steps 100.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
# Only what the job runs, with the build's [n/N] progress lines on stderr.
echo "run_main: building gpt_train (a few minutes on 2 cores the first time)" >&2
PO_BUILD_TARGETS=gpt_train "$root/scripts/build.sh" >&2
build_dir=${PO_BUILD_DIR:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun -np 4 --oversubscribe "$build_dir/examples/gpt/gpt_train" --schedule po-f --chunks 2 "$@"
