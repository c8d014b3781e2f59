add_library(opguard_warnings INTERFACE)
target_compile_options(opguard_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
if(OPGUARD_WERROR)
  target_compile_options(opguard_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
