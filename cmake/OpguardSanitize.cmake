# OPGUARD_SANITIZE and OPGUARD_FUZZ instrument everything this build compiles
# (tests/sanitize runs such builds from CTest). Libraries found with
# find_package (HDF5, libtorch) stay uninstrumented.
if(OPGUARD_SANITIZE)
  # UBSan findings abort, so that a test or the fuzzer fails on them instead of
  # printing a line nobody reads.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${OPGUARD_SANITIZE};-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  add_link_options(-fsanitize=${OPGUARD_SANITIZE})
endif()
if(OPGUARD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "OPGUARD_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++-14 "
                        "(Debian packages clang-14 libclang-rt-14-dev)")
  endif()
  # Coverage feedback for the libFuzzer targets in our own code; the targets
  # themselves link -fsanitize=fuzzer (tests/fuzz).
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
endif()
