#!/usr/bin/env bash
# binaries: schedule_bench schedule_bench_before
# seconds: 150
# Issue 15, compile time on the GPU machine's 16 cores: bench/schedule_bench's seven cases
# (p=64 m=512 v=4, every policy; the bar: each under a second, in bounded memory), each
# under /usr/bin/time for its peak RSS, then po-f at 1, 2, 4, 8 and 16 compiler threads
# (PO_COMPILE_THREADS) to show how the parallel half scales.
set -uo pipefail
bench=$BUILD/bench/schedule_bench
echo "cores: $(nproc)"
for case in 1f1b interleaved group po-h po-f selective auto; do
  repeats=5
  [[ $case == auto ]] && repeats=1
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f "$case peak RSS %M KB" "$bench" --repeats "$repeats" --benchmarks="$case" 2>&1
  else  # the peak RSS from the kernel's accounting of the finished child
    python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[2:], check=False)
print(sys.argv[1], "peak RSS", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "KB")' \
      "$case" "$bench" --repeats "$repeats" --benchmarks="$case"
  fi
done
for threads in 1 2 4 8 16; do
  echo "PO_COMPILE_THREADS=$threads"
  PO_COMPILE_THREADS=$threads "$bench" --repeats 5 --benchmarks=po-f | tail -1
done
# A binary of the commit before, packed beside it as schedule_bench_before (optional), runs
# the offload cases and auto in turns with this one, for a before/after on the same machine.
before=$BUILD/bench/schedule_bench_before
if [[ -x "$before" ]]; then
  for turn in 1 2; do
    for binary in "$before" "$bench"; do
      echo "turn $turn $(basename "$binary")"
      "$binary" --repeats 3 --benchmarks=po-h,po-f,selective | tail -3
      "$binary" --repeats 1 --benchmarks=auto | tail -1
    done
  done
fi
