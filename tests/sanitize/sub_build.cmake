# Configures and builds one instrumented sub-build of this source tree.
#   cmake -DSOURCE=... -DBUILD=... -DTARGETS="a;b" -DCONFIG_ARGS="-DX=1;-DY=2" -P sub_build.cmake
# Configured on every run, so that changed CONFIG_ARGS take effect (seconds);
# reruns rebuild only what changed, like the main build.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -G Ninja ${CONFIG_ARGS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  file(REMOVE ${BUILD}/build.ninja)
  message(FATAL_ERROR "configuring ${BUILD} failed:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target ${TARGETS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building ${BUILD} failed:\n${out}")
endif()
message("built ${TARGETS} in ${BUILD}")
