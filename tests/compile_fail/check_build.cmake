# cmake -DBINARY_DIR=<build> -DTARGET=<target> -DEXPECT=success|failure [-DPATTERNS=<a;b>]
#       [-DCONFIG=<cfg>] -P check_build.cmake
#
# Builds one EXCLUDE_FROM_ALL target of the dtrain build. EXPECT=success: it must compile.
# EXPECT=failure: it must not, and the compiler output must contain every one of PATTERNS.
cmake_minimum_required(VERSION 3.20)
foreach(var IN ITEMS BINARY_DIR TARGET EXPECT)
  if(NOT ${var})
    message(FATAL_ERROR "check_build.cmake: pass -D${var}=...")
  endif()
endforeach()

set(config_args)
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BINARY_DIR}" --target "${TARGET}"
                        ${config_args}
                OUTPUT_VARIABLE output ERROR_VARIABLE output RESULT_VARIABLE rc)

if(EXPECT STREQUAL "success")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TARGET} must compile but failed (${rc}):\n${output}")
  endif()
  message(STATUS "${TARGET} compiled")
elseif(EXPECT STREQUAL "failure")
  if(rc EQUAL 0)
    message(FATAL_ERROR "${TARGET} compiled, but it passes a non-tensor to dtrain and must be "
                        "rejected at compile time:\n${output}")
  endif()
  foreach(pattern IN LISTS PATTERNS)
    if(NOT output MATCHES "${pattern}")
      message(FATAL_ERROR "${TARGET} failed to compile, but the diagnostics do not mention "
                          "'${pattern}':\n${output}")
    endif()
  endforeach()
  # Show the lines a user would read first.
  string(REGEX MATCHALL "[^\n]*(error|tensor_traits)[^\n]*" lines "${output}")
  list(SUBLIST lines 0 8 lines)
  list(JOIN lines "\n" lines)
  message(STATUS "${TARGET} was rejected as expected:\n${lines}")
else()
  message(FATAL_ERROR "EXPECT must be success or failure, not '${EXPECT}'")
endif()
