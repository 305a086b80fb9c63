#!/usr/bin/env bash
# Regenerates the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/) from real po-schedule
# outputs, the only writer of those files: schedule JSON and PyTorch CSVs of every family and
# offload policy at small shapes (so libFuzzer mutates files the readers really see), and spec
# bytes for fuzz_spec. The cost-model seeds are hand-written (po-schedule prints no cost model)
# and left as they are.
# Usage: scripts/update_fuzz_seeds.sh [build_dir]    (default: $PO_BUILD_DIR, else build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-${PO_BUILD_DIR:-$root/build}}
cmake --build "$build_dir" --target po-schedule -j "${PO_JOBS:-2}"
po=$build_dir/po-schedule
corpus=$root/tests/fuzz/corpus
mkdir -p "$corpus/fuzz_schedule_json" "$corpus/fuzz_pytorch_csv" "$corpus/fuzz_spec"

json() {  # json <name> <po-schedule args...>
  local name=$1
  shift
  "$po" "$@" --unit-costs --format json --out "$corpus/fuzz_schedule_json/$name.json" 2>/dev/null
}
json 1f1b_p2_m4 --stages 2 --microbatches 4
json 1f1b_p4_m8_split --stages 4 --microbatches 8 --split-backward
json interleaved_p2_m4_v2 --stages 2 --microbatches 4 --policy interleaved --chunks 2
json group_p4_m8_v2_split --stages 4 --microbatches 8 --policy group-interleaved --chunks 2 \
  --split-backward
json po-h_p2_m4 --stages 2 --microbatches 4 --policy po-h
json po-f_p4_m8_v2 --stages 4 --microbatches 8 --policy po-f --chunks 2
json selective_p4_m8_v2 --stages 4 --microbatches 8 --policy selective --chunks 2 \
  --offload-chunks 1

# fuzz_pytorch_csv: byte 0 holds the stage count minus one (low nibble) and the family hint
# (high nibble: 0 1f1b, 1 interleaved, 2 group-interleaved); the CSV follows.
csv() {  # csv <name> <header byte, octal> <po-schedule args...>
  local name=$1 header=$2
  shift 2
  {
    printf "\\$header"
    "$po" "$@" 2>/dev/null
  } >"$corpus/fuzz_pytorch_csv/$name.csv"
}
csv 1f1b_p4_m8 003 --stages 4 --microbatches 8 --format pytorch-csv
csv 1f1b_p4_m8_comms 003 --stages 4 --microbatches 8 --format pytorch-csv-comms
csv interleaved_p2_m4_v2 021 --stages 2 --microbatches 4 --policy interleaved --chunks 2 \
  --format pytorch-csv
csv group_p4_m8_v2_split 043 --stages 4 --microbatches 8 --policy group-interleaved --chunks 2 \
  --split-backward --format pytorch-csv-comms

# fuzz_spec, in the order fuzz_spec.cc reads bytes: p-1, m-1, v-1, family, offload, split, g,
# fraction*10, offload_chunks, the budget (4 bytes, then a shift), strict, the unit-cost k*4,
# and which cost fields follow (0: none).
spec() {  # spec <name> <octal bytes...>
  local name=$1
  shift
  printf "$(printf '\\%s' "$@")" >"$corpus/fuzz_spec/$name.bin"
}
spec 1f1b_p4_m8 003 007 000 000 000 000 000 000 000 000 000 000 000 000 000 001 000
spec po-h_p4_m8 003 007 000 000 001 000 000 000 000 000 000 000 000 000 000 001 000
spec po-f_group_p4_m8_v2 003 007 001 002 002 001 000 000 000 000 000 000 000 000 000 001 000
spec selective_p8_m16_v2 007 017 001 002 003 000 000 003 000 000 000 000 000 000 000 001 000
spec auto_p4_m8_v2 003 007 001 002 004 000 000 000 000 000 001 000 000 020 000 001 000
echo "update_fuzz_seeds: wrote $(find "$corpus" -type f | wc -l) seeds under $corpus"
