# gpt_train --backend cuda on a machine without a usable GPU (CUDA_VISIBLE_DEVICES=-1 hides any
# GPU, so this holds on GPU machines too): a clear error and a non-zero exit, never a crash or a
# hang; and the flag errors of the CUDA options come before any device is touched.
set(ENV{CUDA_VISIBLE_DEVICES} -1)

# expect_failure(<name> <exit code> <pattern> args...)
function(expect_failure name code pattern)
  execute_process(COMMAND ${GPT_TRAIN} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc TIMEOUT 120)
  if(NOT rc STREQUAL "${code}")
    message(FATAL_ERROR "${name}: exit '${rc}', expected ${code} (a signal or timeout shows as "
                        "text):\n${out}\n${err}")
  endif()
  if(NOT err MATCHES "gpt_train: error: ")
    message(FATAL_ERROR "${name}: no 'gpt_train: error:' line on stderr:\n${err}")
  endif()
  if(NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "${name}: stderr lacks /${pattern}/:\n${err}")
  endif()
  message(STATUS "${name}: exit ${rc}: ${err}")
endfunction()

set(no_gpu "needs 1 GPU\\(s\\), but CUDA sees 0 \\(no usable GPU|built without CUDA")
expect_failure("local, no GPU" 1 "${no_gpu}"
               --backend cuda --transport local --stages 2 --steps 1 --embd 128)
expect_failure("auto (local without mpirun), no GPU" 1 "${no_gpu}" --backend cuda --steps 1)
expect_failure("optimizer offload, no GPU" 1 "${no_gpu}"
               --backend cuda --transport local --optimizer-offload interleaved --steps 1)
expect_failure("--tied with cuda" 2 "--tied is not supported with --backend cuda"
               --backend cuda --tied)
expect_failure("offload without cuda" 2 "--optimizer-offload needs --backend cuda"
               --optimizer-offload cpu)
expect_failure("a bad backend" 2 "--backend expects cpu or cuda, got 'gpu'" --backend gpu)
