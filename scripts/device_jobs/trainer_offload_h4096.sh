#!/usr/bin/env bash
# binaries: gpt_train
# seconds: 110
# Issue 6 end to end on one H200: gpt_train --backend cuda, 4 stages as threads, h = 4096,
# 1f1b, and po-f with --optimizer-offload none / cpu / interleaved (4 runs): GPU memory for
# optimizer state now that offload drops the model's own copy.
# Outputs: $LOG/trainer.txt (every run), stdout (key lines).
set -uo pipefail
bin=$BUILD/examples/gpt/gpt_train
# device_batch.sh has put cuBLAS on LD_LIBRARY_PATH (scripts/find_cublas.sh).
ldd "$bin" | grep -i -E "cublas|nccl|not found"
export NCCL_NVLS_ENABLE=0
out="$LOG/trainer.txt"
: >"$out"
# Kernel-side state of every thread of a process that looks stuck (we run as root).
dump_threads() {
  local pid=$1
  echo "-- stalled pid $pid ($(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null | cut -c1-80)):"
  for task in /proc/$pid/task/*; do
    printf '   %s %s wchan=%s syscall=%s\n' "${task##*/}" "$(cat $task/comm 2>/dev/null)" \
      "$(cat $task/wchan 2>/dev/null)" "$(cut -d' ' -f1 $task/syscall 2>/dev/null)"
  done | sort -k2 | uniq -c -f1 | head -40
}
run() {  # run LIMIT_S ARGS...: prints the command, keeps everything, shows the key lines
  local limit=$1; shift
  echo "== $(date +%T) $*" | tee -a "$out"
  if [ $((SECONDS + limit / 2)) -gt 100 ]; then echo "skipped: the job budget" | tee -a "$out"; return; fi
  [ $((SECONDS + limit)) -gt 105 ] && limit=$((105 - SECONDS))
  local start=$SECONDS
  "$@" >"$LOG/part.txt" 2>&1 &
  local pid=$! rc=
  while kill -0 $pid 2>/dev/null; do
    if [ $((SECONDS - start)) -ge $((limit - 2)) ]; then
      dump_threads $pid | tee -a "$out"
      for child in $(pgrep -P $pid); do dump_threads $child | tee -a "$out"; done
      kill -TERM $pid 2>/dev/null; sleep 1; kill -KILL $pid 2>/dev/null
      rc=124
      break
    fi
    sleep 0.2
  done
  wait $pid 2>/dev/null; local status=$?
  rc=${rc:-$status}
  head -c 30000 "$LOG/part.txt" >>"$out"
  echo "rc=$rc ($((SECONDS - start)) s)" | tee -a "$out"
  grep -E "^(pipeline|plan|step|stage [0-9]+ runs|stash peaks|mean step|checksum|\[cuda_train\])|error|MISMATCH|FAILED|passed|failed" \
    "$LOG/part.txt" | cut -c1-400 | head -40
}
# Issue 6 end to end: optimizer offload together with activation offload (po-f), h = 4096.
big="--backend cuda --transport local --stages 4 --chunks 1 --embd 4096 --layers 4"
big="$big --seq 2048 --batch 1 --microbatches 8 --steps 3 --lr 0.0003 --watchdog 120"
run 40 "$bin" $big --schedule 1f1b --optimizer-offload none
for mode in none cpu interleaved; do
  run 40 "$bin" $big --schedule po-f --optimizer-offload $mode
done
rm -f "$LOG/part.txt"
