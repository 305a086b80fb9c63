# PO_SANITIZE: the sanitizers every C and C++ target of the build is compiled and linked with,
# as a -fsanitize= list: "address,undefined" (scripts/sanitize.sh asan) or "thread" (tsan).
# Empty: none.
# PO_ASAN=ON is the older spelling of PO_SANITIZE=address,undefined.
#
# Only C and C++ get the flags: nvcc does not take -fsanitize, and device code is checked on the
# GPU machine by compute-sanitizer instead (scripts/device_jobs/compute_sanitizer.sh).
# Debian's static Abseil is not instrumented. That costs ASan/UBSan nothing but coverage of
# Abseil's own code. For TSan it would hide the happens-before edges of Abseil's internal
# synchronization; our code takes no absl::Mutex or absl::Notification (std::mutex and
# std::condition_variable, which TSan intercepts), so what remains is listed with a reason in
# tests/sanitizers/tsan.supp.
set(PO_SANITIZE "" CACHE STRING
    "Sanitizers for every C and C++ target, as a -fsanitize= list (address,undefined or thread)")
if(PO_ASAN AND PO_SANITIZE STREQUAL "")
  set(PO_SANITIZE "address,undefined")
endif()

if(NOT PO_SANITIZE STREQUAL "")
  if(PO_SANITIZE MATCHES "thread" AND PO_SANITIZE MATCHES "address")
    message(FATAL_ERROR "PO_SANITIZE=${PO_SANITIZE}: thread and address cannot be combined "
                        "(build one of each: scripts/sanitize.sh asan, scripts/sanitize.sh tsan)")
  endif()
  if(PO_WITH_CUDA)
    # nvcc links the CUDA binaries and would need the flags passed through to its host
    # compiler; device code is compute-sanitizer's, so sanitizer builds are CPU only.
    message(FATAL_ERROR "PO_SANITIZE=${PO_SANITIZE} with PO_WITH_CUDA=ON: configure with "
                        "-DPO_WITH_CUDA=OFF (GPU code: scripts/device_jobs/compute_sanitizer.sh)")
  endif()
  set(po_sanitize_flags -fsanitize=${PO_SANITIZE} -fno-omit-frame-pointer)
  if(PO_SANITIZE MATCHES "undefined")
    # UBSan only prints and carries on by default; a test must fail on undefined behaviour.
    list(APPEND po_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${po_sanitize_flags}>")
  add_link_options(-fsanitize=${PO_SANITIZE})
  message(STATUS "pipeoffload: sanitizers ${PO_SANITIZE} on every C and C++ target")
endif()
