# Loss falls: 200 steps of gpt_train's default config (8 layers, C 64, T 32, B 4 x m 8, the
# synthetic corpus; 4 stages as threads, group-interleaved v = 2) must end at a loss below half
# the corpus's unigram entropy (2.944 nats -> threshold about 1.47 nats; with gpt_train's default
# warm-up, cosine decay and clipping the run reaches about 0.86). A model that learned only byte frequencies stops at the entropy; beating half of it
# means the model learned words and sentence shape.
set(threshold_share 0.5)
execute_process(COMMAND ${GPT_TRAIN} --transport local --steps 200
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 540)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gpt_train failed (${rc}):\n${out}\n${err}")
endif()
if(NOT out MATCHES "unigram entropy ([0-9.]+) nats")
  message(FATAL_ERROR "no entropy line in:\n${out}")
endif()
set(entropy ${CMAKE_MATCH_1})
if(NOT out MATCHES "step 0 loss ([0-9.e+-]+)")
  message(FATAL_ERROR "no step 0 line in:\n${out}")
endif()
set(first ${CMAKE_MATCH_1})
if(NOT out MATCHES "step 199 loss ([0-9.e+-]+)")
  message(FATAL_ERROR "no step 199 line in:\n${out}")
endif()
set(last ${CMAKE_MATCH_1})
# CMake's math() is integer-only: compare in micro-nats.
foreach(name entropy first last)
  string(REGEX REPLACE "^([0-9]+)\\.([0-9]*)$" "\\1;\\2" parts "${${name}}")
  list(GET parts 0 whole)
  list(LENGTH parts n)
  set(fraction "000000")
  if(n EQUAL 2)
    list(GET parts 1 fraction)
    string(APPEND fraction "000000")
  endif()
  string(SUBSTRING "${fraction}" 0 6 fraction)
  string(REGEX REPLACE "^0+([0-9])" "\\1" fraction "${fraction}")
  math(EXPR ${name}_micro "${whole} * 1000000 + ${fraction}")
endforeach()
math(EXPR threshold_micro "${entropy_micro} / 2")  # threshold_share = 0.5
message(STATUS "unigram entropy ${entropy} nats; loss ${first} at step 0, ${last} at step 199; "
               "threshold ${threshold_micro} micro-nats")
if(NOT last_micro LESS threshold_micro)
  message(FATAL_ERROR "loss ${last} after 200 steps is not below ${threshold_share} x the "
                      "unigram entropy ${entropy}:\n${out}")
endif()
if(NOT last_micro LESS first_micro)
  message(FATAL_ERROR "the loss did not fall: ${first} -> ${last}")
endif()
