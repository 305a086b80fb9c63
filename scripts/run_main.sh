#!/usr/bin/env bash
# The README's main job: set up, build, and compare every schedule policy on the default
# pipeline (po-schedule compare; 8 stages, 32 microbatches, a GPT layer stack at h=8192).
# Extra arguments go to po-schedule compare (try --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" >/dev/null
build_dir=${PO_BUILD_DIR:-$root/build}
"$build_dir/po-schedule" compare "$@"
