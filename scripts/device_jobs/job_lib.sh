# Shared by the device jobs that run gpt_train command lines (source it from the repository
# root, where device_batch.sh runs every job): `run NAME LIMIT ARGS...` logs the command and its
# output to $LOG/NAME.log under `timeout LIMIT`, prints the exit status, the seconds taken and
# the lines worth reading; a run that would start past $JOB_DEADLINE_S seconds of the job is
# skipped, so a batch ends inside one device call. RUN_GREP overrides which lines are shown.
run() {  # run NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  if ((SECONDS > ${JOB_DEADLINE_S:-450})); then
    echo "== $name: skipped (past ${JOB_DEADLINE_S:-450} s)"
    return
  fi
  echo "== $name: $*" | tee "$LOG/$name.log"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$LOG/$name.log" 2>&1
  echo "rc=$? ($((SECONDS - start)) s)"
  grep -E "${RUN_GREP:-^(pipeline|plan|costs|links)|^mean step|^stage [0-9]: stash|^checksum|error}" \
    "$LOG/$name.log" | cut -c1-330
}

# For jobs that run test binaries: `t LIMIT BINARY ARGS...` appends the binary's output (60 kB
# at most) to $TESTS_OUT, prints its exit status and Catch's summary lines (TESTS_GREP adds to
# them).
t() {  # t LIMIT BINARY ARGS...
  local limit=$1; shift
  echo "== $(date -u +%T) $(basename "$1") ${*:2}" | tee -a "$TESTS_OUT"
  timeout "$limit" "$@" >"$LOG/part.txt" 2>&1; local rc=$?
  head -c 60000 "$LOG/part.txt" >>"$TESTS_OUT"
  echo "rc=$rc" | tee -a "$TESTS_OUT"
  grep -E "FAILED|passed|failed|test cases${TESTS_GREP:+|$TESTS_GREP}" "$LOG/part.txt" | tail -6
}
