#!/usr/bin/env bash
# Issue 7: PO-F / PO-H pipelines over NCCL on several GPUs, one MPI rank per GPU.
#
#   scripts/device_multi_gpu.sh              on a machine with 4 or 8 GPUs (results in $OUT)
#   scripts/device_multi_gpu.sh --rehearse   the same command lines with --backend cpu at a
#                                            tiny size on CPU ranks (mpirun --oversubscribe):
#                                            proves the flags, launch and parsing before a
#                                            multi-GPU machine is lent
#
# For each rank count P in $GPUS (default "4 8"; counts above the visible GPUs are skipped with
# a note) and each hidden size in $HIDDEN (default "4096 8192"), seq 2048, microbatch 1,
# m = 4P microbatches, the same total layers at every P (so per-GPU work halves from 4 to 8
# GPUs): the schedules 1f1b, interleaved, group-interleaved, po-h, po-f and auto (budget: 70% of
# the stash peak of its order without offload; at P = 2 even po-f keeps 60%), the interleaved
# ones with v = 4 chunks per stage (fewer when a stage has fewer layers), planned on measured
# costs (gpt_train's default with --backend cuda). Each run prints its loss, step time and model TFLOP/s per GPU
# per step, each stage's stash peak measured vs predicted, and the predicted bubble; the
# group-interleaved and po-f runs at the first (P, h) also write their measured traces (check
# staggering and P2P time with and without offload there). NCCL's NVLink multicast is off
# (NCCL_NVLS_ENABLE=0).
#
# Environment: GPT_TRAIN (default $BUILD/examples/gpt/gpt_train, BUILD default build),
# OUT (default ./multi_gpu_out), GPUS, HIDDEN, SCHEDULES (default the six above), STEPS (default 6),
# LAYERS_4096 (default 32), LAYERS_8192 (default 16), CHUNKS (default above), AUTO_BUDGET
# (default 70%), MPIRUN (default mpirun), MPIRUN_FLAGS (extra mpirun flags). Outputs in $OUT: one log per run (<P>gpu_h<h>_<schedule>.log), traces, and
# summary.md (one table row per run).
# Exit status: 0 when every run that was started succeeded; 1 otherwise. In --rehearse mode
# also 1 when the CPU runs of one P disagree on the checksum (they must be bitwise equal).
set -uo pipefail

rehearse=0
[ "${1:-}" = "--rehearse" ] && rehearse=1
BUILD=${BUILD:-build}
GPT_TRAIN=${GPT_TRAIN:-$BUILD/examples/gpt/gpt_train}
OUT=${OUT:-multi_gpu_out}
MPIRUN=${MPIRUN:-mpirun}
schedules=${SCHEDULES:-"1f1b interleaved group-interleaved po-h po-f auto"}
mkdir -p "$OUT"
summary="$OUT/summary.md"
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [ ! -x "$GPT_TRAIN" ]; then
  echo "device_multi_gpu: no gpt_train at $GPT_TRAIN (set BUILD or GPT_TRAIN)" >&2
  exit 1
fi

if [ $rehearse = 1 ]; then
  GPUS=${GPUS:-"4 8"}
  HIDDEN=${HIDDEN:-"64"}
  STEPS=${STEPS:-2}
  available=1000  # CPU ranks: any count (oversubscribed)
  mpirun_flags="--oversubscribe ${MPIRUN_FLAGS:-}"
else
  GPUS=${GPUS:-"4 8"}
  HIDDEN=${HIDDEN:-"4096 8192"}
  STEPS=${STEPS:-6}
  available=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
  mpirun_flags="${MPIRUN_FLAGS:-} -x NCCL_NVLS_ENABLE --bind-to none"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null
fi

# The model flags of one hidden size: the real sizes on GPUs, a tiny model when rehearsing.
model_flags() {  # model_flags H P
  local h=$1 p=$2 layers
  if [ $rehearse = 1 ]; then
    layers=16
    echo -n "--backend cpu --embd $h --heads 4 --layers $layers --seq 32 --batch 2"
  else
    if [ "$h" -ge 8192 ]; then layers=${LAYERS_8192:-16}; else layers=${LAYERS_4096:-32}; fi
    echo -n "--backend cuda --embd $h --layers $layers --seq 2048 --batch 1 --lr 0.0003"
  fi
  # Chunks per stage for the interleaved families: CHUNKS, else 4 (at most a layer each).
  # gpt_train plans offload on measured costs, and only entries of a few layers are short
  # enough to hide behind compute (docs/benchmarks.md: at P = 2, h = 4096, v = 2 po-f cannot
  # lower stage 0's peak without slowing the step; v = 4 can).
  local chunks=${CHUNKS:-$((layers / p < 4 ? layers / p : 4))}
  echo " --microbatches $((4 * p)) --chunks $((chunks > 1 ? chunks : 2))"
}

schedule_flags() {  # schedule_flags NAME
  case $1 in
    auto) echo "--schedule auto --memory-budget ${AUTO_BUDGET:-70%}" ;;
    1f1b) echo "--schedule 1f1b --chunks 1" ;;
    *) echo "--schedule $1" ;;
  esac
}

printf '| P | h | schedule | rc | mean step s | TFLOP/s per GPU (last step) | predicted bubble | stage 0 stash peak measured / predicted B | max stash peak B | copy overlaps / stage 0 median send ms (traced) | checksum |\n' >"$summary"
printf '|---|---|---|---|---|---|---|---|---|---|---|\n' >>"$summary"

failed=0
first=1
for p in $GPUS; do
  if [ "$p" -gt "$available" ]; then
    echo "device_multi_gpu: skipping P=$p: only $available GPU(s) visible" | tee -a "$summary"
    continue
  fi
  for h in $HIDDEN; do
    for schedule in $schedules; do
      name="${p}gpu_h${h}_${schedule}"
      log="$OUT/$name.log"
      trace=""
      if [ $first = 1 ] && { [ "$schedule" = group-interleaved ] || [ "$schedule" = po-f ]; }; then
        trace="--trace $OUT/${name}_trace.json"
      fi
      # shellcheck disable=SC2046,SC2086
      set -- "$MPIRUN" -np "$p" $mpirun_flags "$GPT_TRAIN" --transport mpi $(model_flags "$h" "$p") \
        $(schedule_flags "$schedule") --steps "$STEPS" --watchdog 300 $trace
      echo "== $*" | tee "$log.cmd"
      start=$SECONDS
      "$@" >"$log" 2>&1
      rc=$?
      echo "rc=$rc ($((SECONDS - start)) s)"
      [ $rc = 0 ] || failed=1
      grep -E "^(pipeline|plan:|plan warning: auto|costs|links)|^step $((STEPS - 1)) |^mean step|error" "$log" |
        cut -c1-300
      mean=$(sed -n 's/^mean step time \([0-9.]*\) s.*/\1/p' "$log")
      tflops=$(grep "^step " "$log" | tail -1 | sed -n 's/.*model \([0-9.]*\) TFLOP.*/\1/p')
      bubble=$(sed -n 's/^plan: .*bubble \([0-9.]*\);.*/\1/p' "$log")
      stage0=$(sed -n 's/^stage 0: stash peak \([0-9]*\) B measured, \([0-9]*\) B predicted.*/\1 \/ \2/p' "$log")
      maxpeak=$(sed -n 's/^stage [0-9]*: stash peak \([0-9]*\) B measured.*/\1/p' "$log" | sort -n | tail -1)
      checksum=$(sed -n 's/^checksum \(0x[0-9a-f]*\)/\1/p' "$log")
      links=$(sed -n 's/^links (traced step): \([0-9]*\) overlapping.* 0: sends [0-9]*, median \([0-9.]*\) ms.*/\1 \/ \2/p' "$log")
      printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$p" "$h" "$schedule" \
        "$rc" "${mean:--}" "${tflops:--}" "${bubble:--}" "${stage0:--}" "${maxpeak:--}" \
        "${links:--}" "${checksum:--}" >>"$summary"
    done
    first=0
  done
done

if [ $rehearse = 1 ]; then
  # On the CPU every schedule computes the same bits: one checksum per (P, h). The checksum is
  # the last column (rows end in "|", so field NF is empty).
  while read -r key; do
    sums=$(awk -F'|' -v k="$key" '{gsub(/ /, "", $2); gsub(/ /, "", $3);
             if ($2 "_" $3 == k) {c = $(NF - 1); gsub(/ /, "", c); print c}}' "$summary" |
           sort -u)
    if [ "$(echo "$sums" | wc -l)" != 1 ] || [ "$sums" = "-" ]; then
      echo "device_multi_gpu: P_h=$key: the schedules' checksums differ: $sums" | tee -a "$summary"
      failed=1
    fi
  done < <(awk -F'|' 'NR > 2 && NF > 10 {gsub(/ /, "", $2); gsub(/ /, "", $3); print $2 "_" $3}' \
             "$summary" | sort -u)
fi
cat "$summary"
exit $failed
