# Helpers of the gpt_train script tests: run the trainer (single process or under mpirun) with a
# time limit, and pull the numbers out of its output. Every run that exceeds its limit fails the
# test (a hang is a failure, never a stuck CI job).

# The tiny model every script test trains: 3 steps of 4 layers, C 16, T 8, B 2, m 8.
set(TINY_MODEL --layers 4 --embd 16 --heads 2 --seq 8 --batch 2 --microbatches 8 --steps 3
               --watchdog 30)
set(RUN_LIMIT_SECONDS 120)

# train_run(<out_var> <rc_var> <num_ranks> args...): num_ranks 0 runs one process without
# mpirun; otherwise mpirun starts num_ranks ranks. stdout and stderr are merged into out_var.
function(train_run out_var rc_var num_ranks)
  if(num_ranks EQUAL 0)
    set(command ${GPT_TRAIN} ${ARGN})
  else()
    separate_arguments(preflags UNIX_COMMAND "${MPIEXEC_PREFLAGS}")
    set(command ${MPIEXEC} ${MPIEXEC_NUMPROC_FLAG} ${num_ranks} --oversubscribe ${preflags}
                ${GPT_TRAIN} ${ARGN})
  endif()
  string(REPLACE ";" " " shown "${command}")
  message(STATUS "running: ${shown}")
  execute_process(COMMAND ${command} OUTPUT_VARIABLE out ERROR_VARIABLE out
                  RESULT_VARIABLE rc TIMEOUT ${RUN_LIMIT_SECONDS})
  if(NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "'${shown}' did not finish within ${RUN_LIMIT_SECONDS} s (${rc}):\n${out}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

# train_run_ok(<out_var> <num_ranks> args...): as train_run, and the run must exit 0.
function(train_run_ok out_var num_ranks)
  train_run(out rc ${num_ranks} ${ARGN})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gpt_train ${ARGN} on ${num_ranks} ranks exited with ${rc}:\n${out}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# The "checksum 0x..." value; fails when absent.
function(train_checksum out_var output)
  if(NOT output MATCHES "checksum (0x[0-9a-f]+)")
    message(FATAL_ERROR "no checksum line in:\n${output}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# Every "step N loss X" line, in order, as a list (the exact printed digits).
function(train_losses out_var output)
  string(REGEX MATCHALL "step [0-9]+ loss [^ ]+" losses "${output}")
  set(${out_var} "${losses}" PARENT_SCOPE)
endfunction()

# For stage `stage`: the measured and predicted stash peaks and the offloaded bytes per step.
function(train_stage_numbers measured_var predicted_var offloaded_var output stage)
  set(pattern "stage ${stage}: stash peak ([0-9]+) B measured, ([0-9]+) B predicted")
  string(APPEND pattern "[^\n]* offloaded ([0-9]+) B/step")
  if(NOT output MATCHES "${pattern}")
    message(FATAL_ERROR "no line for stage ${stage} in:\n${output}")
  endif()
  set(${measured_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(${predicted_var} "${CMAKE_MATCH_2}" PARENT_SCOPE)
  set(${offloaded_var} "${CMAKE_MATCH_3}" PARENT_SCOPE)
endfunction()

# Fails unless `output` contains `text` (a regular expression); `what` says which run.
function(train_expect output text what)
  if(NOT output MATCHES "${text}")
    message(FATAL_ERROR "${what}: expected /${text}/ in the output:\n${output}")
  endif()
endfunction()
