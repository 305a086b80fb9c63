# What the hostile-input scripts share (po_schedule_hostile_test.cmake and
# gpt_train_hostile_test.cmake).
#
# expect_exit(<binary> <expected> <needle> args...): runs `binary args...` under a 60 s guard (a
# hang guard, not a speed test) and fails on a signal or a timeout, on an exit code other than
# `expected` (a number, or "nonzero"), when stdout + stderr lack `needle`, or on an error message
# over 4 KiB (user text is echoed shortened, never whole).
function(expect_exit binary expected needle)
  execute_process(COMMAND "${binary}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 60)
  get_filename_component(name "${binary}" NAME)
  string(JOIN " " shown ${name} ${ARGN})
  string(LENGTH "${shown}" shown_length)
  if(shown_length GREATER 200)
    string(SUBSTRING "${shown}" 0 200 shown)
  endif()
  string(SUBSTRING "${err}" 0 2000 err_start)
  if(NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "${shown}: ended by \"${rc}\" (a signal or a timeout)\n${err_start}")
  endif()
  if((expected STREQUAL "nonzero" AND rc EQUAL 0) OR
     (NOT expected STREQUAL "nonzero" AND NOT rc EQUAL expected))
    message(FATAL_ERROR "${shown}: exit ${rc}, expected ${expected}\n${err_start}")
  endif()
  string(FIND "${out}${err}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${shown}: expected \"${needle}\" in:\n${err_start}")
  endif()
  string(LENGTH "${err}" err_length)
  if(err_length GREATER 4096)
    message(FATAL_ERROR "${shown}: a ${err_length}-byte error message")
  endif()
endfunction()
