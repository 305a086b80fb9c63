# install and export: every library po_add_library declared (the global property
# PO_LIBRARY_TARGETS), the `pipeoffload` umbrella and po-schedule, with a config that finds what
# those libraries link, as this build found it. Included once, at the end of the top-level
# CMakeLists.txt, when every target exists. tests/package checks the result from outside.
include(CMakePackageConfigHelpers)

get_property(po_library_targets GLOBAL PROPERTY PO_LIBRARY_TARGETS)
# lib/c_api installs its shared library itself (component c_api, into the same export set).
list(REMOVE_ITEM po_library_targets po_c_api)
set(PO_INSTALLED_TARGETS ${po_library_targets} pipeoffload po-schedule)

# What the config must find again, as @VAR@ switches (pipeoffloadConfig.cmake.in).
set(PO_INSTALLED_MPI OFF)
if(TARGET po_transport_mpi OR TARGET po_transport_nccl)
  set(PO_INSTALLED_MPI ON)
endif()
set(PO_INSTALLED_CUDA OFF)
if(TARGET po_backend_cuda)
  set(PO_INSTALLED_CUDA ON)
endif()
set(PO_INSTALLED_NCCL OFF)
if(TARGET po_transport_nccl)
  set(PO_INSTALLED_NCCL ON)
endif()
# liburing has no CMake package: lib/slide made PkgConfig::LIBURING, pointed at the archive it
# links (see there); the config recreates that target with the same library file.
set(PO_INSTALLED_LIBURING OFF)
if(TARGET po_slide_nvme)
  get_directory_property(po_liburing_archive DIRECTORY lib/slide DEFINITION PO_LIBURING_ARCHIVE)
  get_directory_property(po_liburing_libraries DIRECTORY lib/slide
                         DEFINITION LIBURING_LINK_LIBRARIES)
  if(EXISTS "${po_liburing_archive}")
    set(PO_LIBURING_LINK "${po_liburing_archive}")
  else()
    set(PO_LIBURING_LINK "${po_liburing_libraries}")
  endif()
  set(PO_INSTALLED_LIBURING ON)
endif()

install(TARGETS ${PO_INSTALLED_TARGETS}
        EXPORT pipeoffloadTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/pipeoffload DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT pipeoffloadTargets NAMESPACE pipeoffload::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipeoffload)
configure_package_config_file(cmake/pipeoffloadConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/pipeoffloadConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipeoffload)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/pipeoffloadConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pipeoffloadConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/pipeoffloadConfigVersion.cmake
              cmake/FindNCCL.cmake cmake/AbslStatic.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipeoffload)

# `ninja installable` builds just what `cmake --install` copies (every library, po-schedule and
# lib/c_api's shared library), without the tests, examples and benchmarks.
add_custom_target(installable)
add_dependencies(installable ${PO_INSTALLED_TARGETS} po_c_api)
