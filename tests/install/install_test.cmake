# Driver of the `install` test (cmake -P). Works in its own mktemp directory,
# removed on success and kept (path printed) on failure.
execute_process(COMMAND mktemp -d /tmp/opguard_install_test_XXXXXX OUTPUT_VARIABLE tmp OUTPUT_STRIP_TRAILING_WHITESPACE)
set(prefix ${tmp}/prefix)

function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(step_out "${out}" PARENT_SCOPE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${name} failed (${rc}): ${ARGN}\n${out}\n${err}\nevidence kept in ${tmp}")
  endif()
endfunction()

macro(expect what pattern)
  if(NOT step_out MATCHES "${pattern}")
    message(FATAL_ERROR "install test: ${what}: output does not match '${pattern}':\n${step_out}\nevidence kept in ${tmp}")
  endif()
endmacro()

step("cmake --install" ${CMAKE_COMMAND} --install ${OPGUARD_BUILD_DIR} --prefix ${prefix})
foreach(f bin/opguard lib/libopguard_record.so include/opguard/record/recorder.h include/opguard/record/scope.h
          share/opguard/python/opguard/__init__.py share/opguard/python/boot/sitecustomize.py
          lib/cmake/opguard/opguardConfig.cmake lib/cmake/opguard/opguardConfigVersion.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install test: ${prefix}/${f} was not installed")
  endif()
endforeach()

step("configure the consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${tmp}/build -G ${GENERATOR}
     "-DCMAKE_PREFIX_PATH=${prefix}\;${TORCH_PREFIX}" -DCMAKE_BUILD_TYPE=Release)
step("build the consumer" ${CMAKE_COMMAND} --build ${tmp}/build)

# Linked: the program starts the recorder itself.
step("run the consumer" ${tmp}/build/train ${tmp}/linked)
expect("the linked run" "events [1-9][0-9]*\nresult bits ([0-9a-f]+)")
set(linked_bits ${CMAKE_MATCH_1})
if(NOT linked_bits)
  message(FATAL_ERROR "install test: no result bits in the linked run\nevidence kept in ${tmp}")
endif()
step("opguard ls (linked)" ${prefix}/bin/opguard ls ${tmp}/linked)
expect("opguard ls (linked)" "events in 3 complete step")
# Preloaded by the installed CLI: it must find the installed library.
step("opguard record" ${prefix}/bin/opguard record --out ${tmp}/preloaded -- ${tmp}/build/train)
expect("the preloaded run" "result bits ${linked_bits}")
step("opguard ls (preloaded)" ${prefix}/bin/opguard ls ${tmp}/preloaded)
expect("opguard ls (preloaded)" "events in 3 complete step")

# The installed Python package finds the installed library.
step("the installed Python package" ${CMAKE_COMMAND} -E env PYTHONPATH=${prefix}/share/opguard/python
     ${PYTHON} -c "import opguard, torch\nopguard.load()\nprint('opguard ops', torch.ops.opguard.active())")
expect("the installed Python package" "opguard ops False")

message(STATUS "install test: consumer built against ${prefix}; linked and preloaded runs recorded, result bits ${linked_bits} in both")
file(REMOVE_RECURSE ${tmp})
