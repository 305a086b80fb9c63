# Every schedule family and offload policy trains the tiny GPT on 4 MPI ranks and ends with
# parameters bitwise equal (checksum) to the single-process reference, with the same loss digits
# at every step; the measured stash peak of every stage equals the compiler's prediction
# exactly; offload policies move bytes and lower the peak, the others move none. Also split
# backward + tied head, and a schedule file from po-schedule.
include(${CMAKE_CURRENT_LIST_DIR}/train_common.cmake)
file(MAKE_DIRECTORY ${WORK_DIR})

train_run_ok(reference 0 ${TINY_MODEL})
train_checksum(reference_checksum "${reference}")
train_losses(reference_losses "${reference}")
list(LENGTH reference_losses steps)
if(NOT steps EQUAL 3)
  message(FATAL_ERROR "the reference printed ${steps} loss lines, expected 3:\n${reference}")
endif()

# Stage 0's stash peak without offload (group-interleaved, v = 2), to show po-f lowers it.
set(no_offload_peak "")

# name | flags | offloads (1: must move bytes on some stage, 0: must move none)
set(cases
    "1f1b|--schedule 1f1b|0"
    "interleaved|--schedule interleaved|0"
    "group-interleaved|--schedule group-interleaved|0"
    "po-h|--schedule po-h|1"
    "po-f|--schedule po-f|1"
    "selective|--schedule selective --offload-fraction 0.5|1"
    "po-f-1f1b|--schedule po-f --family 1f1b|1")
foreach(case IN LISTS cases)
  string(REPLACE "|" ";" fields "${case}")
  list(GET fields 0 name)
  list(GET fields 1 flag_text)
  list(GET fields 2 offloads)
  separate_arguments(fields UNIX_COMMAND "${flag_text}")
  train_run_ok(out 4 ${TINY_MODEL} ${fields})
  train_checksum(checksum "${out}")
  if(NOT checksum STREQUAL reference_checksum)
    message(FATAL_ERROR "${name}: checksum ${checksum} != reference ${reference_checksum}:\n${out}")
  endif()
  train_losses(losses "${out}")
  if(NOT losses STREQUAL reference_losses)
    message(FATAL_ERROR "${name}: losses ${losses} != reference ${reference_losses}")
  endif()
  set(total_offloaded 0)
  foreach(stage RANGE 3)
    train_stage_numbers(measured predicted offloaded "${out}" ${stage})
    if(NOT measured EQUAL predicted)
      message(FATAL_ERROR "${name}: stage ${stage} stash peak measured ${measured} != "
                          "predicted ${predicted}:\n${out}")
    endif()
    math(EXPR total_offloaded "${total_offloaded} + ${offloaded}")
    if(stage EQUAL 0 AND name STREQUAL "group-interleaved")
      set(no_offload_peak ${measured})
    endif()
    if(stage EQUAL 0 AND name STREQUAL "po-f")
      set(po_f_peak ${measured})
    endif()
  endforeach()
  if(offloads AND total_offloaded EQUAL 0)
    message(FATAL_ERROR "${name}: an offload policy moved no bytes:\n${out}")
  elseif(NOT offloads AND NOT total_offloaded EQUAL 0)
    message(FATAL_ERROR "${name}: moved ${total_offloaded} bytes without an offload policy")
  endif()
  message(STATUS "${name}: checksum ${checksum}, peaks exact, ${total_offloaded} B offloaded")
endforeach()
if(NOT po_f_peak LESS no_offload_peak)
  message(FATAL_ERROR "po-f's stage 0 peak ${po_f_peak} is not below group-interleaved's "
                      "${no_offload_peak}")
endif()

# Split backward (W ops) with a tied head: stages 0 and 3 exchange the tied gradient.
train_run_ok(tied_reference 0 ${TINY_MODEL} --tied)
train_checksum(tied_checksum "${tied_reference}")
foreach(flags "--schedule;po-f;--split-backward;--tied" "--schedule;interleaved;--tied")
  train_run_ok(out 4 ${TINY_MODEL} ${flags})
  train_checksum(checksum "${out}")
  if(NOT checksum STREQUAL tied_checksum)
    message(FATAL_ERROR "${flags}: checksum ${checksum} != tied reference ${tied_checksum}")
  endif()
  train_expect("${out}" "stash peaks: measured == predicted on every stage" "${flags}")
endforeach()
if(tied_checksum STREQUAL reference_checksum)
  message(FATAL_ERROR "tying the head did not change the checksum: the comparison is blind")
endif()

# A schedule written by po-schedule (its own unit cost model) runs unchanged.
execute_process(COMMAND ${PO_SCHEDULE} --stages 4 --microbatches 8 --chunks 2 --policy po-f
                        --unit-costs --format json --out ${WORK_DIR}/po_f_p4.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "po-schedule failed (${rc}):\n${out}")
endif()
train_run_ok(out 4 ${TINY_MODEL} --schedule-file ${WORK_DIR}/po_f_p4.json)
train_checksum(checksum "${out}")
if(NOT checksum STREQUAL reference_checksum)
  message(FATAL_ERROR "--schedule-file: checksum ${checksum} != reference ${reference_checksum}")
endif()
train_expect("${out}" "stash peaks: measured == predicted on every stage" "--schedule-file")
