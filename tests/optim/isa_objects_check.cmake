# Checks the per-ISA kernel objects (adam_avx2, adam_avx512) for code that could run on a CPU
# without their ISA: a static initializer (_GLOBAL__sub_I_*) runs at program start on every CPU,
# and a weak or unique symbol (an inline function or template instantiation) may be the copy the
# linker keeps for every caller. Either would be compiled with -mavx2 / -mavx512f.
#   cmake -DNM=<nm> -DOBJECTS=<a.o;b.o;...> -P isa_objects_check.cmake
set(checked 0)
foreach(object IN LISTS OBJECTS)
  if(NOT object MATCHES "adam_avx(2|512)\\.cc\\.o$")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  execute_process(COMMAND ${NM} -C ${object} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm failed on ${object}")
  endif()
  string(REPLACE "\n" ";" lines "${symbols}")
  foreach(line IN LISTS lines)
    if(line MATCHES " [WVu] " OR line MATCHES "_GLOBAL__sub_I")
      message(FATAL_ERROR "${object}: ISA-flagged code others could run: ${line}")
    endif()
  endforeach()
  message(STATUS "${object}: no static initializers, no weak symbols")
endforeach()
if(NOT checked EQUAL 2)
  message(FATAL_ERROR "expected the adam_avx2 and adam_avx512 objects, found ${checked}")
endif()
