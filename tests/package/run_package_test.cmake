# Installs the build tree into a scratch prefix, then configures and builds the consumer project
# (tests/package/CMakeLists.txt) against it with find_package(pipeoffload), and runs the CPU
# consumers: `consumer` (a pipeline checked against its predictions) and the minimal trainer
# (exit 0 only when its loss fell). cuda_consumer, when built, is left for the test
# package_consumer_cuda (label gpu), which runs it where there is a GPU.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
set(configure "configure;${CMAKE_COMMAND};-S;${SOURCE_DIR};-B;${build};-G;Ninja")
list(APPEND configure "-DCMAKE_PREFIX_PATH=${prefix}"
                      "-DMINIMAL_TRAINER_SOURCE=${MINIMAL_TRAINER_SOURCE}")
foreach(step
    "install;${CMAKE_COMMAND};--install;${BUILD_DIR};--prefix;${prefix}"
    "${configure}"
    "build;${CMAKE_COMMAND};--build;${build}"
    "run consumer;${build}/consumer"
    "run minimal_trainer;${build}/minimal_trainer;30")
  list(POP_FRONT step name)
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test step '${name}' failed (${rc}):\n${out}\n${err}")
  endif()
  if(name MATCHES "^run")
    message(STATUS "${name}:\n${out}")
  endif()
endforeach()
if(EXISTS "${build}/cuda_consumer")
  message(STATUS "cuda_consumer built against the installed CUDA targets (package_consumer_cuda "
                 "runs it on a GPU)")
endif()
