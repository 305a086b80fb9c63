# Runs one libFuzzer target for SECONDS seconds on a fresh copy of its seeds and fails on any
# crash, leak, timeout (-timeout: one input may take 30 s; an auto spec takes 1.3 s under ASan
# alone and 10 s on a loaded 2-core host) or out-of-memory (-rss_limit_mb), printing the
# reproducer libFuzzer saved. Every seed is also run once (-runs over the seeds is
# implied: libFuzzer executes the corpus before mutating it).
# cmake -DFUZZER=<binary> -DSEEDS=<dir> -DWORK=<dir> -DSECONDS=<n> -P run_fuzzer.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/corpus" "${WORK}/artifacts")
file(GLOB seeds "${SEEDS}/*")
file(COPY ${seeds} DESTINATION "${WORK}/corpus")
execute_process(
  COMMAND "${FUZZER}" -max_total_time=${SECONDS} -timeout=30 -rss_limit_mb=2048 -max_len=65536
          -print_final_stats=1 -artifact_prefix=${WORK}/artifacts/ "${WORK}/corpus"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${err}")
message(STATUS "${FUZZER}: ${runs}, exit ${rc}")
if(NOT rc EQUAL 0)
  file(GLOB found "${WORK}/artifacts/*")
  string(LENGTH "${err}" n)
  if(n GREATER 6000)
    math(EXPR from "${n} - 6000")
    string(SUBSTRING "${err}" ${from} 6000 err)
  endif()
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); reproducers: ${found}\n${err}")
endif()
