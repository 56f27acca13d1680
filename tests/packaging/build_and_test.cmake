# cmake -DCTEST_COMMAND=<ctest> -DBINARY_DIR=<dir> -P build_and_test.cmake
#       -- <ctest --build-and-test arguments>
#
# Runs `ctest --build-and-test` in a fresh BINARY_DIR. A CMakeCache.txt left by an earlier run
# would keep the earlier answers (option defaults, the MPI found) and hide a regression.
cmake_minimum_required(VERSION 3.20)
foreach(var IN ITEMS CTEST_COMMAND BINARY_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "build_and_test.cmake: pass -D${var}=...")
  endif()
endforeach()

include("${CMAKE_CURRENT_LIST_DIR}/script_arguments.cmake")
dtrain_script_arguments(args)

file(REMOVE_RECURSE "${BINARY_DIR}")
execute_process(COMMAND "${CTEST_COMMAND}" ${args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ctest --build-and-test failed (${rc})")
endif()
