# Runs one libFuzzer target for SECONDS over a fresh seed corpus (made by SEEDS)
# plus what earlier runs in WORK/corpus found and the inputs of REGRESSIONS
# (findings of earlier runs, kept in the repository); fails on any finding. The last
# line libFuzzer prints ("Done N runs in S second(s)") is the execution count.
#   cmake -DFUZZER=... -DSEEDS=... -DWORK=... -DSECONDS=60 -DLSAN_SUPP=... -DREGRESSIONS=... -P run_fuzzer.cmake
file(REMOVE_RECURSE ${WORK}/seeds)
file(MAKE_DIRECTORY ${WORK}/seeds ${WORK}/corpus)
execute_process(COMMAND ${SEEDS} ${WORK}/seeds RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the seed writer failed (${rc})")
endif()
# HDF5 leaks on some error paths: LSAN_SUPP names it (tests/sanitize/lsan.supp).
set(ENV{LSAN_OPTIONS} "suppressions=${LSAN_SUPP}:print_suppressions=0")
execute_process(
  COMMAND ${FUZZER} -max_total_time=${SECONDS} -timeout=20 -rss_limit_mb=2048 -max_len=65536
          -print_final_stats=1 -artifact_prefix=${WORK}/ ${WORK}/corpus ${WORK}/seeds ${REGRESSIONS}
  WORKING_DIRECTORY ${WORK}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCH "Done [0-9]+ runs in [0-9]+ second" done "${out}")
string(REGEX MATCH "stat::number_of_executed_units: [0-9]+" units "${out}")
if(NOT rc EQUAL 0)
  message("${out}")
  file(GLOB findings ${WORK}/crash-* ${WORK}/leak-* ${WORK}/timeout-* ${WORK}/oom-*)
  message(FATAL_ERROR "the fuzzer found a bug (exit ${rc}); inputs: ${findings}; "
                      "rerun one with: ${FUZZER} INPUT")
endif()
message("${FUZZER}: ${done} (${units}), no findings")
