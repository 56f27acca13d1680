# cmake -DSOURCE_DIR=<project> -DBINARY_DIR=<dir> -P configure_only.cmake -- <cmake arguments>
#
# Configures SOURCE_DIR in a fresh BINARY_DIR and builds nothing: for consumers whose build takes
# minutes (the libtorch examples), this proves that their CMakeLists.txt finds everything it needs
# in the installed package.
cmake_minimum_required(VERSION 3.20)
foreach(var IN ITEMS SOURCE_DIR BINARY_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "configure_only.cmake: pass -D${var}=...")
  endif()
endforeach()

include("${CMAKE_CURRENT_LIST_DIR}/script_arguments.cmake")
dtrain_script_arguments(args)

file(REMOVE_RECURSE "${BINARY_DIR}")  # no answers cached by an earlier run
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" ${args}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "Configuring ${SOURCE_DIR} against the installed package failed (${rc})")
endif()
