# Hostile inputs to po-schedule (issue 17): every one exits with a non-zero code and a message
# that names the problem, never by a signal, and within a bound on time (a hang guard of 60 s,
# not a speed test: each case takes well under a second; hostile_common.cmake).
# Invoked by CTest: cmake -DPO_SCHEDULE=<binary> -DSOURCE_DIR=<repo> -P po_schedule_hostile_test.cmake
cmake_minimum_required(VERSION 3.25)
set(work "${CMAKE_CURRENT_BINARY_DIR}/po_schedule_hostile_work")
file(REMOVE_RECURSE "${work}")
file(MAKE_DIRECTORY "${work}")

include(${CMAKE_CURRENT_LIST_DIR}/hostile_common.cmake)
# hostile(<expected exit code> <needle> args...): expect_exit on po-schedule.
function(hostile expected needle)
  expect_exit("${PO_SCHEDULE}" ${expected} "${needle}" ${ARGN})
endfunction()

set(fixtures "${SOURCE_DIR}/tests/cli/hostile")

# --- Crashes by signal ---------------------------------------------------------------------
# p * m * v overflows int64 (4 * (2^31 - 1)^2): once a std::length_error abort in the index.
set(ops "")
foreach(d RANGE 3)
  list(APPEND ops "{\"stage\": ${d}, \"ops\": []}")
endforeach()
list(JOIN ops ", " ops)
file(WRITE "${work}/huge_spec.json"
     "{\"format\": \"pipeoffload.schedule/1\", \"spec\": {\"family\": \"1f1b\", \"stages\": 4, "
     "\"microbatches\": 2147483647, \"chunks\": 2147483647}, \"stages\": [${ops}]}")
hostile(2 "(more than 2^63)" validate "${work}/huge_spec.json" --unit-costs)

# A "format" value nested 100,000 arrays deep: once a stack overflow printing it.
string(REPEAT "[" 100000 open)
string(REPEAT "]" 100000 close)
file(WRITE "${work}/deep.json" "{\"format\": ${open}${close}}")
hostile(2 "JSON nests deeper than 32 arrays and objects" validate "${work}/deep.json")
file(WRITE "${work}/deep_cost.json" "{\"stage_time_scale\": ${open}${close}}")
hostile(2 "JSON nests deeper than 32" --cost-model "${work}/deep_cost.json")

# A host link group of INT_MAX stages: once an int overflow sizing the links (SIGSEGV). It is a
# legal value (every stage on one link), so it plans; one past INT_MAX is refused.
hostile(0 "offload=po-f" --policy po-f --stages 4 --microbatches 8 --unit-costs
        --host-link-group-size 2147483647)
hostile(2 "--host-link-group-size: expected an integer >= 1 and <= 2147483647"
        --host-link-group-size 2147483648)
file(WRITE "${work}/group_cost.json" "{\"host_link_group_size\": 2147483647}")
hostile(0 "offload=po-f" --policy po-f --stages 4 --microbatches 8 --cost-model
        "${work}/group_cost.json")

# import --stages 999999999: once sized the stage rows before counting them (bad_alloc).
file(WRITE "${work}/one_row.csv" "0F0,0B0\n")
hostile(2 "the CSV has 1 rows but the pipeline has num_stages = 999999999 ranks"
        import "${work}/one_row.csv" --stages 999999999)

# --- Unbounded reads ---------------------------------------------------------------------------
hostile(2 "not a regular file (a character device)" validate /dev/zero)
hostile(2 "not a regular file (a character device)" import /dev/zero --stages 2)
hostile(2 "not a regular file (a character device)" --cost-model /dev/zero)
hostile(2 "not a regular file (a directory)" validate "${work}")
find_program(MKFIFO mkfifo)
if(MKFIFO)
  execute_process(COMMAND "${MKFIFO}" "${work}/fifo" RESULT_VARIABLE fifo_failed)
  if(NOT fifo_failed)
    hostile(2 "not a regular file (a FIFO)" validate "${work}/fifo")
    hostile(2 "not a regular file (a FIFO)" --cost-model "${work}/fifo")
  endif()
else()
  message(STATUS "no mkfifo: skipping the FIFO cases (bounded_file_test covers them)")
endif()
find_program(TRUNCATE truncate)
if(TRUNCATE)
  # A sparse 300 MiB file: past the 256 MiB limit without writing it.
  execute_process(COMMAND "${TRUNCATE}" -s 300M "${work}/sparse.json" RESULT_VARIABLE trunc_failed)
  if(NOT trunc_failed)
    hostile(2 "has more than 268435456 bytes, the limit for a schedule file"
            validate "${work}/sparse.json")
  endif()
endif()

# --- Wrong successes ---------------------------------------------------------------------------
# Finite but huge times, and bandwidths so small a transfer takes forever: once "step inf ms".
hostile(2 "time units in all, more than the 1e+15" --unit-costs --stages 2 --microbatches 2
        --forward-time 1e300)
# (The planner places nothing over such links, and says so; a file's transfers must run.)
hostile(0 "wrote" --stages 2 --microbatches 4 --policy po-h --unit-costs --format json
        --out "${work}/po-h.json")
hostile(2 "time units in all" validate "${work}/po-h.json" --unit-costs --d2h-bandwidth 1e-300
        --h2d-bandwidth 1e-300 --duplex-bandwidth 1e-300)
# Integer flags past an int: once truncated (hidden 0, "bubble 100%").
foreach(flag gpt-hidden gpt-seq gpt-layers-per-chunk)
  hostile(2 "--${flag}: expected an integer >= 1 and <= 2147483647" --${flag} 4294967296)
endforeach()
# Bytes whose sums overflow.
hostile(2 "the step's bytes overflow a 64-bit integer" --policy po-h --stages 2
        --microbatches 2 --activation-bytes 9223372036854775807)
hostile(2 "the step's bytes overflow a 64-bit integer" --stages 2 --microbatches 2
        --gpt-hidden 2147483647 --gpt-seq 2147483647)
hostile(2 "--memory-budget: expected a byte count below 2^63" --policy auto
        --memory-budget 1e300)
# Bytes after a NUL: once ignored, the file passing as valid.
hostile(2 "holds a NUL byte at offset" validate "${fixtures}/nul_tail.json")
# A spec saying "offload none" over ops that offload: once ran and reported no offload.
hostile(2 "spec.offload: is \"none\" but stages[0].ops[" validate
        "${fixtures}/offload_declared_none.json" --unit-costs)
# Rows of idle cells past --stages (ranks the pipeline lacks): once ignored. Blank lines there
# are an editor's and stay accepted (pytorch_csv_test).
file(WRITE "${work}/extra_rows.csv" "0F0,0B0\n,\n\n")
hostile(2 "row 1 holds only idle cells, a rank the pipeline does not have (num_stages = 1"
        import "${work}/extra_rows.csv" --stages 1)
# Options the policy does not read: once ignored without a word.
hostile(2 "--offload-fraction is read only by --policy selective" --policy po-h
        --offload-fraction 0.5)
hostile(2 "--memory-budget is read only by --policy auto" --policy po-f --memory-budget 1G)
hostile(2 "--offload-ratio is read only by --unit-costs" --offload-ratio 0.5)
hostile(2 "--microbatches is read only by compile and compare" validate
        "${fixtures}/nul_tail.json" --microbatches 4)
hostile(2 "--recompute is read only by compile and compare" validate
        "${fixtures}/nul_tail.json" --recompute full)
hostile(2 "--unsplit-backward is read only by compare (the file holds the spec)" validate
        "${fixtures}/nul_tail.json" --unsplit-backward)
hostile(2 "--recompute-chunks is read only by --recompute lean or full" --recompute-chunks 1)
# A 50 MB string: once echoed whole into the error.
string(REPEAT "abcdefghij" 5000000 long)
file(WRITE "${work}/long_format.json" "{\"format\": \"${long}\"}")
hostile(2 "... (50000000 bytes)" validate "${work}/long_format.json")
file(WRITE "${work}/long_cell.csv" "${long}\n")
hostile(2 "... (50000000 bytes)" import "${work}/long_cell.csv" --stages 1)
# Arguments are at most 128 KiB (Linux MAX_ARG_STRLEN).
string(REPEAT "abcdefghij" 10000 long_arg)
hostile(2 "... (100000 bytes)" --policy "${long_arg}")

# --- Slow legal specs ----------------------------------------------------------------------
# Offload planning above its documented work limit (p*m*v * p*v <= 2^26, --help) is refused at
# once; these once ran past 40 s, or for 22 s and out of memory.
hostile(2 "offload planning work p*m*v * p*v for po-h = 171 * 88 * 6 * 171 * 6 = 92635488 exceeds the limit of 67108864"
        --stages 171 --microbatches 88 --chunks 6 --policy po-h --split-backward)
hostile(2 "exceeds the limit of 67108864" --stages 4096 --microbatches 1024 --policy po-f)
hostile(0 "p*m*v * p*v <= 67108864" --help)
# Below the limit it plans (the 60 s guard is far above its time).
hostile(0 "offload=po-f" --stages 16 --chunks 56 --policy po-f)

message(STATUS "po-schedule hostile inputs: all refused cleanly")
