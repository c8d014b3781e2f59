# `cmake --install <build> --prefix P` lays out what the CLI and a training
# program need:
#   P/bin/opguard
#   P/lib/libopguard_record.so                the recorder (preloaded by `opguard record`, or linked)
#   P/include/opguard/{record,core}/...       the recorder's public headers
#   P/share/opguard/python/{opguard,boot}/    the Python module and the sitecustomize `opguard record` uses
#   P/lib/cmake/opguard/opguardConfig.cmake   find_package(opguard) -> opguard::record
#
# The library goes to lib/, not CMAKE_INSTALL_LIBDIR: the CLI looks for it at
# <bin>/../lib (cli/record_command.cpp), also where GNUInstallDirs would pick
# lib/x86_64-linux-gnu (prefix /usr).
include(CMakePackageConfigHelpers)

set(OPGUARD_INSTALL_CMAKEDIR lib/cmake/opguard)

# In the build tree opguard_record's public torch dependency is opguard_torch_cpu,
# which names libraries by their absolute paths in this build's torch. An
# install must not carry those: consumers get the `torch` target of their own
# find_package(Torch) instead (opguardConfig.cmake finds it and checks the
# version). Rewritten here so record/CMakeLists.txt stays about the build.
get_target_property(_opguard_record_iface opguard_record INTERFACE_LINK_LIBRARIES)
list(TRANSFORM _opguard_record_iface REPLACE "^opguard_torch_cpu$"
     "$<BUILD_INTERFACE:opguard_torch_cpu>;$<INSTALL_INTERFACE:torch>")
set_target_properties(opguard_record PROPERTIES INTERFACE_LINK_LIBRARIES "${_opguard_record_iface}"
                                                EXPORT_NAME record)

install(TARGETS opguard RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS opguard_record EXPORT opguardTargets
  LIBRARY DESTINATION lib
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# recorder.h and scope.h are what a program includes; error.h for catching
# opguard::Error (header-only for that use).
install(FILES ${PROJECT_SOURCE_DIR}/record/include/opguard/record/recorder.h
              ${PROJECT_SOURCE_DIR}/record/include/opguard/record/scope.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/opguard/record)
install(FILES ${PROJECT_SOURCE_DIR}/core/include/opguard/core/error.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/opguard/core)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/opguard ${PROJECT_SOURCE_DIR}/python/boot
        DESTINATION ${CMAKE_INSTALL_DATADIR}/opguard/python
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

install(EXPORT opguardTargets NAMESPACE opguard:: DESTINATION ${OPGUARD_INSTALL_CMAKEDIR})
set(OPGUARD_TORCH_VERSION "${Torch_VERSION}")
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/opguardConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/opguardConfig.cmake
  INSTALL_DESTINATION ${OPGUARD_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/opguardConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/opguardConfig.cmake ${CMAKE_BINARY_DIR}/cmake/opguardConfigVersion.cmake
        DESTINATION ${OPGUARD_INSTALL_CMAKEDIR})
