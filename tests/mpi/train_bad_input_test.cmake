# Bad input on 4 MPI ranks: a wrong stage count (flag or file), corrupted schedule files, a
# budget too small for the plan, a bad flag, and a budget that fails only at run time (stage 0's
# first step; the other ranks wait until the watchdog). Each must exit non-zero, print the
# reason on EVERY rank, and finish within the run limit (train_run fails a run that hangs).
include(${CMAKE_CURRENT_LIST_DIR}/train_common.cmake)
file(MAKE_DIRECTORY ${WORK_DIR})

# train_expect_failure(<name> <pattern> args...): the run exits non-zero, each of the 4 ranks
# prints "gpt_train: rank r...: error:", and `pattern` appears at least once per rank (each
# rank's message carries the reason; with per-rank reasons, every rank lists all of them).
function(train_expect_failure name pattern)
  train_run(out rc 4 ${ARGN})
  if(rc EQUAL 0)
    message(FATAL_ERROR "${name}: exited 0, expected an error:\n${out}")
  endif()
  foreach(rank RANGE 3)
    train_expect("${out}" "gpt_train: rank ${rank}(/4)?: error: " "${name}, rank ${rank}")
  endforeach()
  string(REGEX MATCHALL "${pattern}" found "${out}")
  list(LENGTH found count)
  if(count LESS 4)
    message(FATAL_ERROR "${name}: /${pattern}/ printed ${count} times, expected once per rank "
                        "at least:\n${out}")
  endif()
  message(STATUS "${name}: exit ${rc}, the reason printed on every rank")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

# po-schedule writes the files: a valid 2-stage schedule and a valid 4-stage one to corrupt.
foreach(stages 2 4)
  execute_process(COMMAND ${PO_SCHEDULE} --stages ${stages} --microbatches 8 --chunks 2
                          --policy po-f --unit-costs --format json
                          --out ${WORK_DIR}/bad_input_p${stages}.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 60)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "po-schedule failed (${rc}):\n${out}")
  endif()
endforeach()
file(READ ${WORK_DIR}/bad_input_p4.json valid)

# Replaces the first occurrence of `from` in `text` with `to`.
function(replace_first out_var text from to)
  string(FIND "${text}" "${from}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "'${from}' is not in the schedule file")
  endif()
  string(LENGTH "${from}" length)
  string(SUBSTRING "${text}" 0 ${at} head)
  math(EXPR tail_at "${at} + ${length}")
  string(SUBSTRING "${text}" ${tail_at} -1 tail)
  set(${out_var} "${head}${to}${tail}" PARENT_SCOPE)
endfunction()

string(LENGTH "${valid}" length)
math(EXPR half "${length} / 2")
string(SUBSTRING "${valid}" 0 ${half} truncated)
file(WRITE ${WORK_DIR}/truncated.json "${truncated}")
replace_first(bad_op "${valid}" "\"op\": \"F\"" "\"op\": \"Q\"")
file(WRITE ${WORK_DIR}/bad_op.json "${bad_op}")
# Parses, but stage 0 never sends F0.0's output: the validator must reject it.
replace_first(no_send "${valid}" "{\"op\": \"SEND_F\", \"mb\": 0, \"chunk\": 0, \"peer\": 1}," "")
file(WRITE ${WORK_DIR}/no_send.json "${no_send}")

train_expect_failure("--stages 2 on 4 ranks"
  "the schedule has 2 stages \\(--stages 2\\) but the mpi job has 4 ranks"
  ${TINY_MODEL} --stages 2)
train_expect_failure("a 2-stage schedule file on 4 ranks"
  "the schedule has 2 stages \\(--schedule-file"
  ${TINY_MODEL} --schedule-file ${WORK_DIR}/bad_input_p2.json)
train_expect_failure("a truncated schedule file" "truncated.json is corrupted: JSON syntax error"
                     ${TINY_MODEL} --schedule-file ${WORK_DIR}/truncated.json)
train_expect_failure("an unknown op in the schedule file"
  "bad_op.json is corrupted: .*stages\\[0\\].ops\\[0\\]"
  ${TINY_MODEL} --schedule-file ${WORK_DIR}/bad_op.json)
train_expect_failure("a schedule file that fails validation" "no_send.json is not a valid schedule"
                     ${TINY_MODEL} --schedule-file ${WORK_DIR}/no_send.json)
train_expect_failure("a missing schedule file" "cannot read schedule file"
                     ${TINY_MODEL} --schedule-file ${WORK_DIR}/does_not_exist.json)
train_expect_failure("a budget below the stash peak" "too small for the plan"
                     ${TINY_MODEL} --arena-bytes 16Ki)
# Stage 0's exact stash peak with the arena's alignment, from that message.
set(pattern "stage 0: the program's activation stash peaks at [0-9]+ bytes \\(([0-9]+) with")
if(NOT last_output MATCHES "${pattern}")
  message(FATAL_ERROR "no aligned stash peak for stage 0 in:\n${last_output}")
endif()
set(aligned_peak ${CMAKE_MATCH_1})
train_expect_failure("a bad flag" "--schedule expects 1f1b, interleaved"
                     ${TINY_MODEL} --schedule zero-bubble)

# Stage 0's budget: exactly its aligned stash peak. With the P2P plan (the default) every rank
# refuses it before the first step, naming the P2P peak it leaves no room for.
set(budget ${aligned_peak})
train_expect_failure("a budget without room for the P2P plan" "plus its P2P plan's peak of"
                     ${TINY_MODEL} --arena-bytes ${budget} --watchdog 2)
# Without the plan (--p2p-reserve worst) the executor's setup check passes, but F allocates its
# output's P2P buffer before its stash entry, so the F that reaches the peak fails in stage 0's
# first step, and the other ranks wait until the watchdog (2 s) fires.
string(TIMESTAMP start "%s")
train_expect_failure("a budget that fails in the first step" "step 0 failed on"
                     ${TINY_MODEL} --arena-bytes ${budget} --watchdog 2 --p2p-reserve worst)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
if(seconds GREATER 60)
  message(FATAL_ERROR "the failing step took ${seconds} s to stop every rank (watchdog 2 s)")
endif()
train_expect("${last_output}"
             "rank 0: stage 0, op [0-9]+ \\([^)]*\\): [^\n]*device arena: cannot allocate"
             "the failing rank's own error")
train_expect("${last_output}" "waited 2.0 s for (RECV|SEND)_[FB]"
             "the watchdog naming the op waited for")

# --backend cuda where no GPU is visible (CUDA_VISIBLE_DEVICES=-1 hides any): every rank checks
# its GPU and the ranks agree before NCCL starts, so all 4 stop at once with the reason (or say
# the build has no CUDA).
set(ENV{CUDA_VISIBLE_DEVICES} -1)
train_expect_failure("--backend cuda without a GPU"
  "needs 1 GPU\\(s\\), but CUDA sees 0|built without CUDA"
  ${TINY_MODEL} --backend cuda --embd 64)
unset(ENV{CUDA_VISIBLE_DEVICES})
