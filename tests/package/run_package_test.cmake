# Installs the build tree into a scratch prefix, then configures, builds and runs the consumer
# project against it with find_package(pipeoffload).
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
foreach(step
    "install;${CMAKE_COMMAND};--install;${BUILD_DIR};--prefix;${prefix}"
    "configure;${CMAKE_COMMAND};-S;${SOURCE_DIR};-B;${WORK_DIR}/build;-DCMAKE_PREFIX_PATH=${prefix}"
    "build;${CMAKE_COMMAND};--build;${WORK_DIR}/build"
    "run;${WORK_DIR}/build/consumer")
  list(POP_FRONT step name)
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test step '${name}' failed (${rc}):\n${out}\n${err}")
  endif()
endforeach()
message(STATUS "find_package(pipeoffload) consumer: ${out}")
