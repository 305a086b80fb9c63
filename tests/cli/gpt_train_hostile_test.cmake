# Hostile input files to gpt_train (issue 17), on local stages: --data on /dev/zero, a FIFO or a
# directory, and --schedule-file with JSON nested 100,000 deep, a NUL byte, or a spec that says
# "offload none" over ops that offload; and a CPU model larger than the host. Each must exit
# non-zero with the reason on stderr, never by a signal, a hang (60 s guard) or an unbounded read.
# cmake -DGPT_TRAIN=<binary> -DSOURCE_DIR=<repo> -P gpt_train_hostile_test.cmake
cmake_minimum_required(VERSION 3.25)
set(work "${CMAKE_CURRENT_BINARY_DIR}/gpt_train_hostile_work")
file(REMOVE_RECURSE "${work}")
file(MAKE_DIRECTORY "${work}")
set(tiny --transport local --stages 2 --layers 2 --embd 16 --heads 2 --seq 8 --batch 2
         --microbatches 2 --steps 1)

include(${CMAKE_CURRENT_LIST_DIR}/hostile_common.cmake)
# refused(<name> <needle> args...): gpt_train on the tiny local pipeline exits non-zero with
# `needle` (expect_exit).
function(refused name needle)
  expect_exit("${GPT_TRAIN}" nonzero "${needle}" ${tiny} ${ARGN})
  message(STATUS "${name}: refused")
endfunction()

refused("--data /dev/zero" "'/dev/zero' is not a regular file (a character device)"
        --data /dev/zero)
refused("--data on a directory" "is not a regular file (a directory)" --data "${work}")
find_program(MKFIFO mkfifo)
if(MKFIFO)
  execute_process(COMMAND "${MKFIFO}" "${work}/fifo" RESULT_VARIABLE fifo_failed)
  if(NOT fifo_failed)
    refused("--data on a FIFO" "is not a regular file (a FIFO)" --data "${work}/fifo")
  endif()
endif()

string(REPEAT "[" 100000 open)
string(REPEAT "]" 100000 close)
file(WRITE "${work}/deep.json" "{\"format\": ${open}${close}}")
refused("--schedule-file nested 100,000 deep" "JSON nests deeper than 32"
        --schedule-file "${work}/deep.json")
refused("--schedule-file with a NUL byte" "holds a NUL byte at offset"
        --schedule-file "${SOURCE_DIR}/tests/cli/hostile/nul_tail.json")
refused("--schedule-file saying offload none over offload ops" "spec.offload: is \"none\" but"
        --schedule-file "${SOURCE_DIR}/tests/cli/hostile/offload_declared_none.json")
# A CPU model far larger than any host (--embd 16384: 26e9 parameters, 412 GB of fp32 state):
# refused before anything is allocated, not killed by the kernel's OOM killer.
expect_exit("${GPT_TRAIN}" nonzero "GB are available (MemAvailable)" --transport local
            --embd 16384 --heads 128 --steps 1)
message(STATUS "--embd 16384 on the CPU: refused")
message(STATUS "gpt_train hostile inputs: all refused cleanly")
